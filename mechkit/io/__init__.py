"""Every file mechkit writes goes through here: atomic files, atomic directories, the ``--out`` check.

>>> import tempfile, pathlib
>>> from mechkit.io import atomic_dir, check_out, write_atomic
>>> out = check_out(pathlib.Path(tempfile.mkdtemp()) / "run")
>>> with atomic_dir(out) as tmp:
...     _ = write_atomic(tmp / "report.json", "{}")
>>> [p.name for p in out.iterdir()]
['report.json']
"""

from mechkit.io.atomic import atomic_dir, atomic_file, temp_dir_beside, write_atomic
from mechkit.io.finite import non_finite, refuse_non_finite
from mechkit.io.out import check_out

__all__ = ["atomic_dir", "atomic_file", "check_out", "non_finite", "refuse_non_finite", "temp_dir_beside",
           "write_atomic"]
