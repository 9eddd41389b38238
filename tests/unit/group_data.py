"""Host data as pyinfra would merge it for one host, from the real group_data files."""

import runpy
from pathlib import Path
from types import SimpleNamespace

GROUP_DATA = Path(__file__).resolve().parents[2] / "group_data"


def host_data(host_class: str, lab: bool = False, **overrides) -> SimpleNamespace:
    data = {}
    for name in ["all", host_class, *(["lab"] if lab else [])]:
        values = runpy.run_path(str(GROUP_DATA / f"{name}.py"))
        data.update({k: v for k, v in values.items() if not k.startswith("__") and k not in
                     ("HUB_URL", "INDEX_URL", "WHEELS_URL")})
    data.update(overrides)
    return SimpleNamespace(**data)
