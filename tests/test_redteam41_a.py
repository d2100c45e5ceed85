"""Red-team pass 41 (a), fixed: the kernel's mount list still lists a mount that a later mount hides.

R1: a lock was named through such a hidden mount, so two names of one ``--out`` took two locks and a third place
was refused as in use. R2: where the name through the file system's own mount was hidden, the place kept the name
it was given, so a run went on inside a folder another run held under a second bind mount. R3: a plain folder
where a hidden mount was listed was refused as a mount point. R4: a killed ``--force`` write read through a bind
mount of the run's folder was not rolled back ("no report at ..."). Mounts are now asked which one a name reaches
(``/proc/self/fdinfo``'s ``mnt_id``), and a name is taken only where the place is reachable by it now.
"""

from __future__ import annotations

from tests.mounts import NEEDS_MOUNTS, in_namespace

pytestmark = NEEDS_MOUNTS

_HOLD = '''
from mechkit.io.outlock import out_lock
import threading
held, done = threading.Event(), threading.Event()
def hold(where):
    with out_lock(where):
        held.set(); done.wait(60)
def holding(where):
    t = threading.Thread(target=hold, args=(where,)); t.start(); held.wait(60); return t
from mechkit.report import build_report, write_report
def write(where):
    try:
        write_report(where, build_report(plugin="x", plugin_version="1", model={}, params={}, seed=0,
                     results={"a": 1}, artifacts=[], timings={}), force=True)
        return "WRITTEN"
    except Exception as err:
        return f"REFUSED {type(err).__name__} {err}"
def mount(*args):
    subprocess.run(["mount", *args], check=True)
'''


def test_a_hidden_mount_never_names_a_lock(tmp_path):
    said = in_namespace(tmp_path, prelude=_HOLD, body='''
for d in ("t/inner", "other", "yb"):
    (B / d).mkdir(parents=True)
mount("-t", "tmpfs", "x", str(B / "other"))
mount("--bind", str(B / "other"), str(B / "t" / "inner"))
mount("-t", "tmpfs", "y", str(B / "t"))          # hides t/inner's mount, which the kernel still lists
(B / "t" / "inner").mkdir()
mount("--bind", str(B / "t"), str(B / "yb"))
from mechkit.io.locks import lock_path
print("SAME", lock_path(B / "t" / "inner" / "foo") == lock_path(B / "yb" / "inner" / "foo"))
print("APART", lock_path(B / "other" / "foo") != lock_path(B / "t" / "inner" / "foo"))
t = holding(B / "t" / "inner" / "foo")
print("ALIAS", write(B / "yb" / "inner" / "foo"))
print("OTHER", write(B / "other" / "foo"))
done.set(); t.join()
''')
    assert "SAME True" in said and "APART True" in said, said
    assert "ALIAS REFUSED OutInUseError" in said and "OTHER WRITTEN" in said, said


def test_a_name_hidden_by_an_over_mount_gives_way_to_one_that_reaches_the_place(tmp_path):
    said = in_namespace(tmp_path, prelude=_HOLD, body='''
for d in ("a/r/sub", "c", "e"):
    (B / d).mkdir(parents=True)
mount("--bind", str(B / "a" / "r"), str(B / "c"))
mount("--bind", str(B / "a"), str(B / "e"))
mount("-t", "tmpfs", "hide", str(B / "a"))       # the file system's own name of a/r is hidden now
t = holding(B / "e" / "r")
print("INSIDE", write(B / "c" / "sub" / "run2"))
done.set(); t.join()
print("LEFT", sorted(os.listdir(B / "c" / "sub")))
''')
    assert "INSIDE REFUSED OutInUseError" in said and "which another mechkit run is writing" in said, said
    assert "LEFT []" in said, said


def test_a_plain_folder_where_a_hidden_mount_is_listed_is_no_mount_point(tmp_path):
    said = in_namespace(tmp_path, prelude=_HOLD, body='''
(B / "s" / "t" / "inner").mkdir(parents=True)
mount("-t", "tmpfs", "x", str(B / "s" / "t" / "inner"))
mount("-t", "tmpfs", "y", str(B / "s" / "t"))
(B / "s" / "t" / "inner").mkdir()
print("PLAIN", write(B / "s" / "t" / "inner"))
mount("-t", "tmpfs", "z", str(B / "s" / "t" / "inner"))
print("MOUNTED", write(B / "s" / "t" / "inner"))
''')
    assert "PLAIN WRITTEN" in said, said
    assert "MOUNTED REFUSED" in said and "is a mount point" in said, said


def test_a_killed_force_write_read_through_a_bind_mount_of_the_run_is_rolled_back(tmp_path):
    said = in_namespace(tmp_path, prelude=_HOLD, body='''
import signal
(B / "a").mkdir(); (B / "c").mkdir()
print(write(B / "a" / "run"))
pid = os.fork()
if pid == 0:  # a --force rewrite killed right after the old report was set aside
    real = os.replace
    def boom(src, dst, *args, **kwargs):
        real(src, dst, *args, **kwargs)
        if ".previous" in str(dst):
            os.kill(os.getpid(), signal.SIGKILL)
    os.replace = boom
    write(B / "a" / "run")
    os._exit(0)
os.waitpid(pid, 0)
print("JOURNAL", any(n.endswith(".mechkit-replace") for n in os.listdir(B / "a")))
mount("--bind", str(B / "a" / "run"), str(B / "c"))
import mechkit as mk
print("READ", mk.load_report(B / "c").results)
''')
    assert "JOURNAL True" in said and "READ {'a': 1}" in said, said
