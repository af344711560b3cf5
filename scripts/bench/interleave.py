"""The order in which one repetition runs a benchmark's variants: a Williams design, so that each
variant runs right after every other one equally often.

A run can leave a cost to the next one: on the test VM a cold load right after one that read the
file with read(2) took 2-3x its time, whoever ran it (docs/notes/benchmarks.md, "The peer
before"). A rotated order puts each variant after the same one in every repetition and charges
that cost to one variant throughout; this order spreads it over all of them."""


def balanced(items, rep):
    """`items` in the order of row `rep` of a Williams design: over len(items) repetitions (twice
    that for an odd count, whose second half runs the first half's rows backwards) every item runs
    right after every other item equally often, and first equally often."""
    items = list(items)
    n = len(items)
    if n < 3:  # one or two: a rotation is already balanced
        shift = rep % max(n, 1)
        return items[shift:] + items[:shift]
    first, low, high = [0], 1, n - 1
    while len(first) < n:  # 0, 1, n-1, 2, n-2, ...
        first.append(low)
        low += 1
        if len(first) < n:
            first.append(high)
            high -= 1
    row = rep % (n if n % 2 == 0 else 2 * n)
    order = [(k + row) % n for k in first]
    if row >= n:
        order.reverse()
    return [items[k] for k in order]
