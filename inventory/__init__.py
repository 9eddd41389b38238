"""The shipped inventories, which pyinfra runs from the checkout: it reads group data from the group_data/
of the directory it runs in (pyinfra_cli/inventory.py), and the deploy needs every knob there. Run from
anywhere else, every host would lack them (`Host has no data 'profiles'`), so an inventory of this package
stops in one line saying where to run it."""

from pathlib import Path

CHECKOUT = Path(__file__).resolve().parent.parent


def _run_from_the_checkout() -> None:
    from pyinfra.context import ctx_state

    cwd = ctx_state.get().cwd if ctx_state.isset() else None
    if cwd and Path(cwd).resolve() != CHECKOUT:
        raise SystemExit(f"pyinfra runs in {cwd}, where it finds no specfleet group_data/ (it reads group data "
                         f"from its working directory): run it from the checkout, cd {CHECKOUT} (or pyinfra "
                         f"--chdir {CHECKOUT} ...)")


_run_from_the_checkout()
