"""Waivers: a check a live waiver covers reads WAIVED whatever it measured; an expired one no longer applies."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from kvgate.gate.verdict import Check, WaiverNote
from kvgate.results.records import CellIdentity

WaiverLookup = Callable[[CellIdentity, str], Any]  # -> matrix.Waiver | None


def apply_waiver(check: Check, identity: CellIdentity | None, waiver_for: WaiverLookup, today: dt.date) -> Check:
    if check.status in ("not_run", "info"):
        return check
    if identity is None:
        return check
    waiver = waiver_for(identity, check.kind)
    if waiver is None:
        return check
    note = WaiverNote(reason=waiver.reason, issue=waiver.issue, expires=waiver.expires.isoformat(),
                      expired=waiver.expired(today), where=f"waivers.toml {waiver.where}")
    if note.expired:
        return replace(check, waiver=note, notes=(*check.notes, f"waiver {waiver.where} expired on {note.expires} "
                                                               f"({waiver.issue}); it no longer applies"))
    outcome = {"pass": "passes now, the waiver may be removed"}.get(check.status, f"would be {check.status}")
    return replace(check, status="waived", waiver=note,
                   detail=f"{check.detail} [waived until {note.expires}: {waiver.issue}; {outcome}]")
