from numlib import compute_result

print(compute_result(17))
