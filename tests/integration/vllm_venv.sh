# The vLLM test venv for tests/integration/test_vllm_*.sh: `. vllm_venv.sh`
# (with $SRC set) creates or reuses it (scripts/vllm-env.sh) and sets $venv,
# or exits the test: 77 (ctest: skipped) where the disk cannot hold it, 1
# when the script fails.
venv=$(sh "$SRC/scripts/vllm-env.sh")
venv_rc=$?
venv=$(printf '%s\n' "$venv" | tail -n 1)
if [ "$venv_rc" = 77 ]; then
    echo "skipped: no room for the vLLM venv (scripts/vllm-env.sh)"
    exit 77
fi
[ "$venv_rc" = 0 ] || { echo "FAIL scripts/vllm-env.sh exited $venv_rc"; exit 1; }
