"""(being written)"""


def rules(size_limit, cse):
    return []
