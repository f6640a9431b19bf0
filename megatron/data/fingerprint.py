"""A dataset's identity by content, not by path: the same .bin/.idx copied elsewhere is the same
sample stream, and a file rebuilt in place is not (issue 41 item 9). A checkpoint records one
fingerprint per data.paths prefix (base/records.DataRecord); a resume compares them.

The fingerprint is both files' sizes and a hash of the .idx file, which holds every document's
length and offset, so two corpora with the same token count still differ. A large .idx is hashed
at its first and last HASH_SPAN bytes only: start-up must stay in seconds for a corpus of a
billion documents, and a change that keeps both sizes and both ends is not a cut or a rebuild."""
from __future__ import annotations

import hashlib
import os

HASH_SPAN = 32 << 20


def fingerprint(prefix: str) -> str:
    """"bin <bytes> idx <bytes> blake2b <hex>" of PREFIX.bin/.idx; "unreadable" when a file
    cannot be read (start-up's own path check names it)."""
    try:
        bin_size = os.path.getsize(prefix + ".bin")
        idx_size = os.path.getsize(prefix + ".idx")
        digest = hashlib.blake2b(digest_size=16)
        with open(prefix + ".idx", "rb") as f:
            digest.update(f.read(HASH_SPAN))
            if idx_size > 2 * HASH_SPAN:
                f.seek(idx_size - HASH_SPAN)
            digest.update(f.read(HASH_SPAN))
    except OSError:
        return "unreadable"
    return f"bin {bin_size} idx {idx_size} blake2b {digest.hexdigest()}"
