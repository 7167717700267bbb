"""A fixed number of mutation-fuzzing cases per input kind (tests/fuzz/fuzz_cli.py: tile IR, LLVM stage
overrides, .npy files): each ends as a success or a user error, never a crash, hang or internal error.
Run the script by hand for more cases (--cases N --seed S)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fuzz"))
import fuzz_cli  # noqa: E402


def test_mutated_inputs_end_in_success_or_a_user_error(linac_bin, monkeypatch, capsys):
    monkeypatch.setenv("LINAC_BIN", str(linac_bin))
    rc = fuzz_cli.main(["--cases", "40", "--seed", "11"])
    out = capsys.readouterr().out
    assert rc == 0, out
