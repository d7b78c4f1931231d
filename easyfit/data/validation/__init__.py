"""Host-side validation of encoded images, before DALI decodes them.

This package exists because DALI 2.4's CPU decoders crash the process (SIGSEGV, no Python
exception) on some broken headers, and decode others silently to wrong pixels. easyfit reads
each file's structure on the host first, so that such a file is named in a
:class:`~easyfit.errors.DataError` before DALI sees it (what is checked:
:mod:`easyfit.data.validation.structure`).
"""
