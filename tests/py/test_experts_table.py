"""ckfs's table of how transformers saves fused expert stacks is what the release declares.

tests/gen/make_experts_table.py reads each model_type's conversions from transformers'
conversion mapping; its record for the venv's release (tests/fixtures/experts/), the C table
built from the records (src/layouts/experts_table.h) and docs/formats.md's table must all
be what that release declares today. The other recorded release (5.23.0) is checked when it
is recorded again: this venv pins 5.10.4, and verl 0.9.1 pins transformers < 5.11.
"""
import subprocess
import sys

from conftest import REPO


def test_table_is_what_transformers_declares():
    p = subprocess.run([sys.executable, str(REPO / "tests" / "gen" / "make_experts_table.py"), "check"],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
