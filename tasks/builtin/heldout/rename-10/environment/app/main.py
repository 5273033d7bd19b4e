from utils import build_result

print(build_result(1))
