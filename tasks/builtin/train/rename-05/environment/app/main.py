from textops import load_result

print(load_result(14))
