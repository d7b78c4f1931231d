"""Host-side validation of encoded images, before DALI decodes them.

This package exists because DALI 2.4's CPU decoders crash the process (SIGSEGV, no Python
exception) on some broken headers, and decode others silently to wrong pixels. easyfit reads
each file's structure on the host first, so that such a file is named in a
:class:`~easyfit.errors.DataError` before DALI sees it:

* :mod:`~easyfit.data.validation.files`: a file on disk (readable, not empty, its bytes
  checked), and the stamps that say when it changed since its check;
* :mod:`~easyfit.data.validation.samples`: a sample's checks (its image, or image and mask)
  by name, and its stamp: what a checker child process runs
  (``easyfit.data.check_pool``);
* :mod:`~easyfit.data.validation.child`: the loop of such a child, which loads this package
  alone (this package imports the standard library only, so that the child starts at once);
* :mod:`~easyfit.data.validation.encoded`: one encoded image's bytes (its kind, whether it is
  whole, its pixels against ``MAX_IMAGE_PIXELS``, its structure);
* :mod:`~easyfit.data.validation.structure` (and :mod:`~easyfit.data.validation.jpeg`): the
  structure of JPEG, PNG, BMP and WebP data.

It takes the bytes and stamps of files kept elsewhere than on a local disk from its callers
(``easyfit.data.storage``), and imports nothing of easyfit outside itself.
"""
