"""(being written)"""

RULES = []
