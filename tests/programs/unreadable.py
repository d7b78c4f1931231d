"""Unreadable (permission-denied) image files, read by a user who may not read them.

    python unreadable.py LATE_DIR EARLY_DIR BAD_FILE

Run as root, it reads everything it needs first, then becomes ``nobody`` (for whom a file with
mode 000 is unreadable; root reads any file). Prints the two errors as JSON on its last line.
"""

import json
import os
import sys

import easyfit as ef
import easyfit.data.diagnose  # noqa: F401 - imported before the process loses its rights
from easyfit.data import Loader

late_dir, early_dir, bad = sys.argv[1:4]
placement = ef.parallel.Placement.create()
late = ef.data.ImageFolder(late_dir)  # as root: the unreadable file is not among those sampled
if os.geteuid() == 0:
    os.setgid(65534)
    os.setuid(65534)
assert not os.access(bad, os.R_OK)
errors = {}
try:
    loader = Loader(late, ef.data.Plan(len(late), len(late), shuffle=False), placement)
    next(loader)
except ef.errors.DataError as e:
    errors["first_batch"] = str(e)
try:
    ef.data.ImageFolder(early_dir)
except ef.errors.DataError as e:
    errors["construction"] = str(e)
print(json.dumps(errors))
