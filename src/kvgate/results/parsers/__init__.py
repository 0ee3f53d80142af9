"""Parsers at the I/O edge: each tool's native output -> typed records of kvgate.results.records.

Every parser takes the text (or bytes) it was given plus a `source` (the file as shown to the user) and
raises kvgate.InputError / InputErrors naming the file, the place in it and, where one fits, the fix.
None of them touches the disk except the readers of `reading`, which they share.
"""
