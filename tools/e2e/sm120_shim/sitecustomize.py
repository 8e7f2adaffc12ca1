"""Start-up hook of the end-to-end harness (never part of build/dsv4): runs in every Python process whose PYTHONPATH
starts with this directory (SGLang's launcher, scheduler, TP workers, detokenizer), then runs the next
sitecustomize.py on sys.path (ours in build/dsv4 for setup (b), or the image's), as Python imports only the first.

What it does is chosen by environment variables the harness sets per setup (dsv4_e2e_shim/__init__.py):
* DSV4_E2E_SM120_VIEW=1: SGLang's own capability predicates answer as on an RTX PRO 6000 (setups a, b);
* DSV4_E2E_WEIGHT_SEED=<int>: SGLang's dummy weights are replaced by seeded ones in the checkpoint's formats
  (all setups).
One line per process on stderr says what it forced. It never breaks start-up and acts once per process, whichever
way build/dsv4's hook chains on (older versions run the first other sitecustomize on sys.path, which is this file
again: it then only chains on to the next one not yet run; newer ones run the next one after their own directory):
an image's own sitecustomize runs once either way.
"""


def _run():
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:
        sys.path.insert(0, here)
    import dsv4_e2e_shim

    if not dsv4_e2e_shim.STARTED:
        dsv4_e2e_shim.start()
    dsv4_e2e_shim.chain_sitecustomize(here)


try:
    _run()
except BaseException as _e:  # noqa: BLE001 - start-up must survive anything
    import sys as _sys

    print(f"[dsv4-e2e-shim] failed: {type(_e).__name__}: {_e}", file=_sys.stderr)
