# Sourced by the scripts that need Python packages: pinned_venv DIR "import CHECK" PACKAGE...
# Makes DIR a virtualenv holding the pinned PACKAGEs, unless the import check already passes
# with its python (so a warm cache costs one interpreter start).
pinned_venv() {
    local dir="$1" check="$2"
    shift 2
    if ! "$dir/bin/python" -c "$check" 2>/dev/null; then
        echo "$(basename "$0"): installing $* into $dir" >&2
        rm -rf "$dir"
        python3 -m venv "$dir"
        "$dir/bin/python" -m pip install --quiet --disable-pip-version-check "$@"
    fi
}
