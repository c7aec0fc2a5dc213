"""Where the tests find data: fixtures in the repository, and the public sets some tests read when a data
folder lies beside the repository (they skip, naming it, where it does not)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# 16 train and 16 test rows of GSM8K (MIT licence beside them): the examples that read openai/gsm8k from the
# hub read these in the tests, which have no network
GSM8K_FIXTURE = ROOT / "tests" / "fixtures" / "gsm8k"
# the full public sets, in the data folder beside the repository (not part of it)
PUBLIC_DATA = ROOT.parent / "shared" / "data"
