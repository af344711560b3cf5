"""Collects per-repetition measurements, computes medians, paired ratios and target checks, and prints them."""

import statistics

# False in a smoke run (--quick): its figures come from toy sizes on a busy machine, so the checks
# are computed and kept in the JSON but printed as "not judged", never as PASS or FAIL.
JUDGED = True


def summary(values):
    """(median, min, max) of a non-empty list, or None."""
    if not values:
        return None
    return statistics.median(values), min(values), max(values)


class Results:
    """Measurements of one scenario: named series (one value per repetition, in repetition order) and checks."""

    def __init__(self, key, title):
        self.key = key
        self.title = title
        self.series = {}  # name -> list of floats
        self.units = {}  # name -> unit label
        self.checks = []
        self.notes = []

    def add(self, name, value, unit="s"):
        self.series.setdefault(name, []).append(value)
        self.units[name] = unit

    def note(self, text):
        self.notes.append(text)

    def paired_ratios(self, slower, faster):
        """Repetition i of `slower` over repetition i of `faster`, for every i measured in both."""
        a, b = self.series.get(slower, []), self.series.get(faster, [])
        return [x / y for x, y in zip(a, b) if y > 0]

    def ratio_check(self, label, slower, faster, target):
        """Pairs repetition i of `slower` with repetition i of `faster` and checks median(slower/faster) >= target.

        The series were measured interleaved, so pairing by index cancels slow drifts of the VM.
        """
        self._check(label, self.paired_ratios(slower, faster), ">=", target, "x")

    def value_check(self, label, name, op, limit, unit=""):
        """Checks the median of series `name` against `limit` with `op` ("<=" or "<" or ">=")."""
        self._check(label, self.series.get(name, []), op, limit, unit)

    def _check(self, label, values, op, target, unit):
        stats = summary(values)
        if stats is None:
            self.checks.append({"label": label, "target": f"{op} {target}{unit}", "status": "not measured"})
            return
        median = stats[0]
        passed = {">=": median >= target, "<=": median <= target, "<": median < target}[op]
        self.checks.append({
            "label": label, "median": median, "min": stats[1], "max": stats[2], "n": len(values),
            "target": f"{op} {target:g}{unit}", "status": "PASS" if passed else "FAIL",
        })

    def to_json(self):
        return {
            "title": self.title,
            "series": {name: {"unit": self.units[name], "values": values,
                              "median": summary(values)[0], "min": min(values), "max": max(values)}
                       for name, values in self.series.items()},
            "checks": self.checks,
            "judged": JUDGED,
            "notes": self.notes,
        }


def _fmt(value, unit):
    if unit == "B":
        return f"{value / 2**20:.1f} MiB"
    if unit == "s":
        return f"{value:.3f}"
    if unit == "us":
        return f"{value:.1f}"
    return f"{value:g}"


def print_results(results, out):
    out.write(f"\n== ({results.key}) {results.title}\n")
    if results.series:
        width = max(len(name) for name in results.series)
        out.write(f"{'series':<{width}}  {'n':>3}  {'median':>12}  min-max\n")
        for name, values in results.series.items():
            unit = results.units[name]
            med, lo, hi = summary(values)
            suffix = f" {unit}" if unit not in ("B", "") else ""
            out.write(f"{name:<{width}}  {len(values):>3}  {_fmt(med, unit):>12}{suffix}  "
                      f"[{_fmt(lo, unit)} - {_fmt(hi, unit)}]\n")
    for check in results.checks:
        if check["status"] == "not measured":
            out.write(f"  check {check['label']}: target {check['target']}: not measured\n")
        else:
            verdict = check["status"] if JUDGED else "not judged (smoke run)"
            out.write(f"  check {check['label']}: median {check['median']:.3g} "
                      f"[{check['min']:.3g} - {check['max']:.3g}] (n={check['n']}), "
                      f"target {check['target']}: {verdict}\n")
    for note in results.notes:
        out.write(f"  note: {note}\n")
