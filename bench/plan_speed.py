"""How long `ragpool plan --stack prod --format json` takes, wall clock, as a user runs it.

Runs the real CLI in a fresh process (imports included) a few times and prints the
figures; the last line is one JSON object.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RUNS = 5


def main() -> None:
    results = {}
    for stack in ("dev", "prod"):
        times = []
        for _ in range(RUNS):
            start = time.perf_counter()
            subprocess.run([sys.executable, "-m", "infra.cli", "plan", "--stack", stack, "--format", "json"],
                           cwd=REPO, check=True, stdout=subprocess.DEVNULL)
            times.append(time.perf_counter() - start)
        results[f"plan_{stack}_wall_s_median"] = round(statistics.median(times), 3)
        results[f"plan_{stack}_wall_s_max"] = round(max(times), 3)
        print(f"plan --stack {stack}: median {statistics.median(times):.2f} s, max {max(times):.2f} s over {RUNS} runs")
    results["target_s"] = 5.0
    print(json.dumps(results))


if __name__ == "__main__":
    main()
