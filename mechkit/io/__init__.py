"""Every file mechkit writes goes through here: atomic files, atomic directories, the ``--out`` check."""

from mechkit.io.atomic import atomic_dir, temp_dir_beside, write_atomic

__all__ = ["atomic_dir", "temp_dir_beside", "write_atomic"]
