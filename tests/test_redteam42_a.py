"""Red-team pass 42 (a), fixed.

F1: where the whole file system was also mounted read-only (a container's volume beside it), a lock was named
through the read-only mount: "cannot lock --out W/run: Read-only file system", steps never kept, a journal "this
user cannot roll back". F2: the name through the whole file system's mount could be too long for a lock beside it.
A place's one name now goes through a writable mount, and one short enough. F3: a mount added during a run changed
its lock's name, and the run's own lock was refused as another's after all its work: a lock held is known by its
file's identity too. F4/F5: a mount a later one hides, still listed by the kernel, was called a mount point ("unmount
it first", which umount answered "not mounted"), refusing a --force rewrite and a cache clear.
"""

from __future__ import annotations

from tests.mounts import NEEDS_MOUNTS, in_namespace

pytestmark = NEEDS_MOUNTS

_TOOLS = '''
from mechkit.report import build_report, write_report
def report():
    return build_report(plugin="x", plugin_version="1", model={}, params={}, seed=0, results={"a": 1}, artifacts=[],
                        timings={})
def write(where, force=False):
    try:
        write_report(where, report(), force=force)
        return "WRITTEN"
    except Exception as err:
        return f"REFUSED {type(err).__name__} {err}"
def mount(*args):
    subprocess.run(["mount", *args], check=True)
'''


def test_a_writable_volume_beside_a_read_only_whole_disk_takes_its_lock_where_it_can_write(tmp_path):
    said = in_namespace(tmp_path, prelude=_TOOLS, body='''
(B / "A").mkdir(); (B / "W").mkdir()
mount("-t", "tmpfs", "whole", str(B / "A")); (B / "A" / "data").mkdir()
mount("--bind", str(B / "A" / "data"), str(B / "W"))
mount("-o", "remount,ro,bind", str(B / "A"))
from mechkit.io.locks import lock_path
print("LOCK", lock_path(B / "W" / "run"))
print("RUN", write(B / "W" / "run"))
print("BOTH", lock_path(B / "A" / "data" / "run") == lock_path(B / "W" / "run"))
''')
    assert f"LOCK {tmp_path / 'W' / '.run.mechkit-lock'}" in said and "RUN WRITTEN" in said, said
    assert "BOTH True" in said, said


def test_a_name_too_long_for_a_lock_gives_way_to_a_shorter_one(tmp_path):
    said = in_namespace(tmp_path, prelude=_TOOLS, body='''
(B / "A").mkdir(); (B / "W").mkdir()
os.chdir(B / "A")
for _ in range(20):  # past PATH_MAX in all: made and mounted by relative names
    os.mkdir("x" * 200)
    os.chdir("x" * 200)
mount("--bind", ".", str(B / "W"))
os.chdir(B)
print("RUN", write(B / "W" / ("r" * 60)))
''')
    assert "RUN WRITTEN" in said, said


def test_a_mount_added_during_a_run_never_makes_its_own_lock_anothers(tmp_path):
    said = in_namespace(tmp_path, prelude=_TOOLS, body='''
(B / "A").mkdir(); (B / "W").mkdir()
mount("-t", "tmpfs", "whole", str(B / "A")); (B / "A" / "data").mkdir()
mount("--bind", str(B / "A" / "data"), str(B / "W"))
from mechkit.io.outlock import out_lock
with out_lock(B / "W" / "run"):
    mount("-t", "tmpfs", "cover", str(B / "A"))  # the whole disk's name of W is hidden now: another lock name
    print("RUN", write(B / "W" / "run"))
''')
    assert "RUN WRITTEN" in said, said


def test_a_hidden_mount_at_a_name_the_run_writes_is_no_mount_point(tmp_path):
    said = in_namespace(tmp_path, prelude=_TOOLS, body='''
(B / "P").mkdir(); (B / "src").write_text("")
mount("-t", "tmpfs", "low", str(B / "P")); (B / "P" / "r2").mkdir(); (B / "P" / "r2" / "report.json").write_text("")
mount("--bind", str(B / "src"), str(B / "P" / "r2" / "report.json"))
mount("-t", "tmpfs", "top", str(B / "P"))
from mechkit.io.read import mount_points
print("LISTED", str(B / "P" / "r2" / "report.json") in mount_points(), str(B / "P") in mount_points())
print("FIRST", write(B / "P" / "r2"))
print("FORCE", write(B / "P" / "r2", force=True))
mount("-t", "tmpfs", "real", str(B / "P" / "r2" / "sub") if (B / "P" / "r2" / "sub").mkdir() is None else "")
print("REAL", str(B / "P" / "r2" / "sub") in mount_points())
''')
    assert "LISTED False True" in said and "FIRST WRITTEN" in said and "FORCE WRITTEN" in said, said
    assert "REAL True" in said, said
