"""The reporter the reference models' self-tests (`torch_*.py --self-test`) share."""

import sys

import torch


def relative(a, b):
    """||a - b|| / ||b|| of two tensors."""
    return float((a - b).norm() / b.norm())


class SelfCheck:
    """Collects named checks, prints each with its value and bound, and returns an exit code."""

    def __init__(self, title):
        self.title = title
        self.failures = []
        print(f"{title} (torch {torch.__version__})", flush=True)

    def at_most(self, what, value, bound):
        self._record(what, value <= bound, f"{value:.3e} (at most {bound:.0e})")

    def at_least(self, what, value, bound):
        self._record(what, value >= bound, f"{value:.3e} (at least {bound:.0e})")

    def holds(self, what, ok, detail=""):
        self._record(what, ok, detail)

    def _record(self, what, ok, detail):
        print(f"  {'ok  ' if ok else 'FAIL'} {what}{': ' + detail if detail else ''}", flush=True)
        if not ok:
            self.failures.append(what)

    def exit_code(self):
        if self.failures:
            print(f"FAIL: {self.title}: {len(self.failures)} check(s) failed: "
                  + "; ".join(self.failures), file=sys.stderr, flush=True)
            return 1
        print(f"PASS: {self.title}", flush=True)
        return 0
