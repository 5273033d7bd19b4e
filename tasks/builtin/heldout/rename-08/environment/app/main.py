from calc import build_score

print(build_score(27))
