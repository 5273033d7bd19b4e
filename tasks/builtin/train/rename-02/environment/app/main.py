from core import count_score

print(count_score(12))
