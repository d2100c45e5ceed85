"""Red-team pass 43 (a), fixed.

F1 (silently wrong): where a place's whole-disk name was too long for a lock, it was named through a bind mount,
and the folders above it were then looked for under that name only: a run writing inside another's ``--out`` went
on. Each folder above is now named as its own writer names it. F2 (data loss): a cover over a cache entry,
unmounted between the mount check and the removal, let ``shutil.rmtree`` delete a user's folder bind-mounted
inside it. Removals now walk by descriptors on one mount (``mechkit.io.remove.remove_tree``). F3 (silently wrong):
``--out x --force`` took ``x``'s lock while a live run wrote ``--out x/model``: the folders inside an ``--out`` are
asked too.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mechkit.io.locks import OutInUseError, refuse_in_use
from mechkit.io.outlock import out_lock
from mechkit.io.remove import remove_tree
from tests.mounts import NEEDS_MOUNTS, in_namespace


def _holder(where: Path):
    code = f"import time\nfrom mechkit.io.outlock import out_lock\nwith out_lock({str(where)!r}):\n" \
           "    print('held', flush=True)\n    time.sleep(60)\n"
    held = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)})
    assert held.stdout.readline().strip() == "held"
    return held


@pytest.mark.parametrize("force", [True, False])
def test_a_live_run_writing_a_folder_inside_the_out_is_refused(tmp_path, force):
    x = tmp_path / "x"
    x.mkdir()
    held = _holder(x / "model")
    try:
        with pytest.raises(OutInUseError, match="holds .*model, which another mechkit run is writing"):
            refuse_in_use(x)
        with pytest.raises(OutInUseError, match="holds .*model, which another mechkit run is writing"), out_lock(x):
            pass
    finally:
        held.kill()
        held.wait()
    with out_lock(x):  # once that run is gone, its lock file is a leftover, no holder
        pass


def test_a_folder_inside_the_out_this_thread_holds_is_no_conflict(tmp_path):
    with out_lock(tmp_path / "x" / "model"), out_lock(tmp_path / "x"):
        pass


def test_remove_tree_removes_a_plain_tree_and_a_link_itself(tmp_path):
    (tmp_path / "t" / "a" / "b").mkdir(parents=True)
    (tmp_path / "t" / "a" / "f").write_text("1")
    (tmp_path / "keep").write_text("mine")
    os.symlink(tmp_path / "keep", tmp_path / "t" / "a" / "link")
    os.symlink(tmp_path / "keep", tmp_path / "alias")
    assert remove_tree(tmp_path / "t") and not (tmp_path / "t").exists()
    assert remove_tree(tmp_path / "alias") and (tmp_path / "keep").read_text() == "mine"
    assert remove_tree(tmp_path / "missing")


@NEEDS_MOUNTS
def test_remove_tree_never_deletes_through_a_bind_mount(tmp_path):
    said = in_namespace(tmp_path, '''
from mechkit.io.remove import remove_tree
(B / "entry" / "sub").mkdir(parents=True); (B / "entry" / "own.txt").write_text("x")
(B / "user").mkdir(); (B / "user" / "precious.txt").write_text("precious")
(B / "file").write_text("theirs"); (B / "entry" / "over").write_text("")
mount("--bind", str(B / "user"), str(B / "entry" / "sub"))
mount("--bind", str(B / "file"), str(B / "entry" / "over"))
print("WHOLE", remove_tree(B / "entry"), sorted(os.listdir(B / "entry")))
print("USER", (B / "user" / "precious.txt").read_text(), (B / "file").read_text())
''')
    assert "WHOLE False ['over', 'sub']" in said and "USER precious theirs" in said, said


@NEEDS_MOUNTS
def test_cache_clear_never_deletes_through_a_mount_a_cover_hid_at_the_check(tmp_path):
    said = in_namespace(tmp_path, '''
entry = B / "cache" / "toy" / "induction-aaaaaaaa"
(entry / "sub").mkdir(parents=True); (entry / "mechkit-toy.json").write_text('{"seed":1,"steps":2}')
(B / "user").mkdir(); (B / "user" / "precious.txt").write_text("precious")
mount("--bind", str(B / "user"), str(entry / "sub"))
mount("-t", "tmpfs", "cover", str(B / "cache" / "toy"))
entry.mkdir(); (entry / "mechkit-toy.json").write_text('{"seed":1,"steps":2}')
from mechkit.io import disk_cache
checked = disk_cache._warn_mounted
def then_unmount(path, points=None):
    found = checked(path, points)
    subprocess.run(["umount", str(B / "cache" / "toy")], capture_output=True)  # the user, at that moment
    return found
disk_cache._warn_mounted = then_unmount
print("CLEARED", disk_cache.clear_cache(["toy/induction-aaaaaaaa"]))
print("USER", sorted(os.listdir(B / "user")))
''')
    assert "USER ['precious.txt']" in said and "never deletes through a mount" in said, said


@NEEDS_MOUNTS
def test_a_place_named_through_a_bind_mount_still_finds_the_lock_of_the_folder_above(tmp_path):
    said = in_namespace(tmp_path, '''
long = B / "long"
os.makedirs(long)
os.chdir(long)
made = len(str(long))
while made < 3780 - 210:
    os.mkdir("d" * 199); os.chdir("d" * 199); made += 200
last = "e" * (3780 - made - 1)
os.mkdir(last); os.chdir(last)
mount("-t", "tmpfs", "t1", ".")
os.chdir(".")
os.chdir(os.getcwd())
os.makedirs("data/a")
(B / "c").mkdir()
mount("--bind", "data/a", str(B / "c"))
here = pathlib.Path(os.getcwd())
import threading
from mechkit.io.outlock import out_lock
from mechkit.io.locks import refuse_in_use
held, done = threading.Event(), threading.Event()
def hold():
    with out_lock(here / "data" / "a"):
        held.set(); done.wait(60)
t = threading.Thread(target=hold); t.start(); held.wait(60)
import queue
q = queue.Queue()
def other():
    try:
        refuse_in_use(B / "c" / ("x" * 30)); q.put("NOT REFUSED")
    except Exception as err:
        q.put(f"REFUSED {type(err).__name__}")
o = threading.Thread(target=other); o.start(); o.join()
print(q.get())
done.set(); t.join()
''')
    assert "REFUSED OutInUseError" in said, said
