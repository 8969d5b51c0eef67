#!/usr/bin/env bash
# CPU side: another commit's evalparity/ package in .oldcode/<rev>/ (git-ignored), to carry to the device and
# run there with CODE=.oldcode/<rev> (scripts/gpu/issue26_run.sh, hidden_passes.sh): an A/B of two commits on
# one machine, where machines differ by more than a change's effect.
set -euo pipefail
REV=${1:?usage: old_code.sh REV}
EXCL=$(git rev-parse --git-path info/exclude)
grep -qxF '/.oldcode/' "$EXCL" || echo '/.oldcode/' >> "$EXCL"
rm -rf ".oldcode/$REV" && mkdir -p ".oldcode/$REV"
git archive "$REV" evalparity | tar -x -C ".oldcode/$REV"
du -sh ".oldcode/$REV"
