"""Parsers at the I/O edge: each tool's native output -> typed records of kvgate.results.

Every parser takes the text (or bytes) it was given plus a `source` (the file as shown to the user) and
raises kvgate.errors.InputError / InputErrors naming the file, the place in it and, where one fits,
the fix. None of them touches the disk except `read_text`, the one reader they share.
"""

from kvgate.parsers._common import read_text

__all__ = ["read_text"]
