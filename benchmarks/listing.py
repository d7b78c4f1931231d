"""Start-up cost of an image folder's listing: ``scan_classes`` and ``path_table`` on CPU.

Writes ``--files`` empty ``.jpg`` files spread over ``--classes`` class folders (once: a
folder already written with the same counts is reused), then times listing the classes and
files (``scan_classes``) and building the path table that DALI reads paths from
(``path_table``), each the best of ``--repeat`` runs, and prints one JSON line: wall-clock
seconds and CPU seconds of this process (user + system, steadier on a shared machine).

python benchmarks/listing.py [--files 200000] [--classes 1000] [--dir /tmp/easyfit-listing]
python benchmarks/listing.py --files 21841 --classes 21841   # ImageNet-21k's classes
"""

from __future__ import annotations

import argparse
import json
import os
import time

from easyfit.data.sources.folder import IMAGE_EXTENSIONS, path_table, scan_classes


def write_folder(root: str, files: int, classes: int) -> str:
    """``root/c<k>/<i>.jpg``: ``files`` empty files over ``classes`` folders (reused when a
    folder of these counts is there)."""
    folder = os.path.join(root, f"{files}-{classes}")
    done = os.path.join(folder, ".complete")
    if os.path.exists(done):
        return folder
    for k in range(classes):
        cls = os.path.join(folder, f"c{k:05d}")
        os.makedirs(cls, exist_ok=True)
        for i in range(k, files, classes):
            os.close(os.open(os.path.join(cls, f"{i:07d}.jpg"), os.O_CREAT | os.O_WRONLY, 0o644))
    open(done, "w").close()
    return folder


def best(f, repeat: int) -> tuple[float, float, object]:
    """The shortest wall-clock and CPU seconds of ``repeat`` calls of ``f``, and its result."""
    walls, cpus, out = [], [], None
    for _ in range(repeat):
        t, c = time.perf_counter(), time.process_time()
        out = f()
        walls.append(time.perf_counter() - t)
        cpus.append(time.process_time() - c)
    return min(walls), min(cpus), out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=200_000)
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--dir", default="/tmp/easyfit-listing")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    root = write_folder(args.dir, args.files, args.classes)
    scan, scan_cpu, (_, files, _) = best(lambda: scan_classes(root, IMAGE_EXTENSIONS), args.repeat)
    table, table_cpu, _ = best(lambda: path_table(files), args.repeat)
    result = {
        "files": len(files),
        "classes": args.classes,
        "scan_classes_s": round(scan, 3),
        "scan_classes_cpu_s": round(scan_cpu, 3),
        "path_table_s": round(table, 3),
        "path_table_cpu_s": round(table_cpu, 3),
    }
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
