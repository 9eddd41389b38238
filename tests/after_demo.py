"""What a user does next on the lab `make demo` converged (CI runs it after the demo: `make demo-check`):
a plain re-run of the README's command changes nothing, and the deployed-host checks pass against the
lab's inventory. Run with the demo's variables exported (the Makefile does)."""

import subprocess
import sys

from tests.helpers import LAB_INVENTORY, PYINFRA, REPO, changed_operations


def main() -> int:
    again = subprocess.run([str(PYINFRA), "-y", LAB_INVENTORY, "deploy.py"], cwd=REPO, capture_output=True, text=True)
    output = again.stdout + again.stderr
    changed = changed_operations(output)
    if again.returncode != 0 or changed:
        print(output[-4000:], f"\nexpected a plain re-run after the demo to change nothing, found exit status "
              f"{again.returncode} and these operations changing: {', '.join(changed) or 'none'}", file=sys.stderr)
        return 1
    print("a plain re-run after the demo changed nothing")
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/deployed",
                           "--inventory", LAB_INVENTORY], cwd=REPO).returncode


if __name__ == "__main__":
    sys.exit(main())
