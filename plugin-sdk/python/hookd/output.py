"""A handler's output: the optional string hookd stores on the delivery and shows in the
admin API (capped by `output_kib`, 64 KiB by default).

`handle` returns a str (stored as is), None (no output), or any other JSON value (a dict, a
list, a number, a bool), which is stored as `json(value)`.
"""

import json as _json

from ._errors import Permanent


def json(value):
    """`value` as compact JSON text (`{"label":"bug"}`, as the Rust SDK's `output::json`
    writes it); a value JSON cannot encode is a `Permanent` error."""
    try:
        return _json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise Permanent("cannot encode output as JSON: %s" % e) from None
