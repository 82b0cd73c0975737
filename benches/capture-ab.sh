#!/usr/bin/env bash
# Forwarding speed with and without live capture (--capture): txonly -> rxonly over memif, two
# `memnic testpmd` processes on CPUs 0 and 1. The receiver runs
#   off      without capture;
#   blocked  capturing rx into a pipe nobody reads until the run is over: the writer blocks at
#            once, the slots run out, every later frame is missed (a capture that cannot keep up);
#   devnull  capturing rx into /dev/null: every frame the writer keeps up with is copied, queued
#            and written (the cost of capturing everything).
# Runs alternate, round by round. Prints the median of the receiver's 1-s Rx-pps samples (first
# two and last one dropped) per variant with min-max, each variant against off, and how many
# frames the captures took and missed.
#
#   benches/capture-ab.sh [--seconds N] [--rounds N] [--size BYTES] [--bin PATH]
set -euo pipefail
T=10
ROUNDS=3
SIZE=64
BIN=
while [ $# -gt 0 ]; do
    case "$1" in
        --seconds) T=$2; shift 2 ;;
        --rounds) ROUNDS=$2; shift 2 ;;
        --size) SIZE=$2; shift 2 ;;
        --bin) BIN=$2; shift 2 ;;
        *) echo "capture-ab.sh: unknown option '$1' (use --seconds N, --rounds N, --size BYTES, --bin PATH)" >&2; exit 2 ;;
    esac
done
cd "$(dirname "$0")/.."
if [ -z "$BIN" ]; then
    cargo build --release -q
    BIN=target/release/memnic
fi
DIR=$(mktemp -d)
trap 'pkill -P $$ 2>/dev/null || true; rm -rf "$DIR"' EXIT
VARIANTS="off blocked devnull"

# run VARIANT -> prints "median min max samples captured missed"
run() {
    local variant=$1 sock=$DIR/memif.sock reader= cap=()
    rm -f "$sock" "$DIR/fifo"
    case $variant in
        blocked)
            mkfifo "$DIR/fifo"
            # Opens the pipe (so testpmd's open returns), reads nothing until the run is over.
            ( exec 3<"$DIR/fifo"; sleep $((T + 4)); cat <&3 >/dev/null ) &
            reader=$!
            cap=(--capture "0:rx=$DIR/fifo") ;;
        devnull) cap=(--capture "0:rx=/dev/null") ;;
    esac
    timeout $((T + 60)) "$BIN" testpmd -l 0 --vdev "memif0,role=server,socket=$sock" \
        --forward-mode=rxonly --stats-period 1 --duration $((T + 2)) ${cap[@]+"${cap[@]}"} \
        >"$DIR/rx.log" 2>&1 &
    local rp=$!
    while [ ! -S "$sock" ]; do sleep 0.05; done
    timeout $((T + 60)) "$BIN" testpmd -l 1 --vdev "memif0,role=client,socket=$sock" \
        --forward-mode=txonly --txpkts="$SIZE" --duration "$T" >"$DIR/tx.log" 2>&1
    wait $rp
    if [ -n "$reader" ]; then wait "$reader"; fi
    local captured missed
    # "  Capture:  RX captured N missed N" in the final stats (none without capture).
    captured=$( (grep -a 'Capture:' "$DIR/rx.log" || true) | tail -1 | awk '{print $4}')
    missed=$( (grep -a 'Capture:' "$DIR/rx.log" || true) | tail -1 | awk '{print $6}')
    grep -a 'Rx-pps:' "$DIR/rx.log" | awk '$2>0{print $2}' | head -n -1 | tail -n +3 >"$DIR/run.samples"
    cat "$DIR/run.samples" >>"$DIR/samples.$variant"
    sort -n "$DIR/run.samples" |
        awk -v c="${captured:--}" -v m="${missed:--}" '{a[NR]=$1} END{
             if (NR==0) {printf "0 0 0 0 %s %s\n", c, m; exit}
             med = (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2;
             printf "%.3f %.3f %.3f %d %s %s\n", med/1e6, a[1]/1e6, a[NR]/1e6, NR, c, m }'
}

declare -A MED
echo "memnic testpmd txonly -> rxonly over memif, ${SIZE}-byte frames, ${T} s per run, ${ROUNDS} rounds"
printf '%5s | %-8s | %-27s | %8s | %12s | %12s\n' round variant "Rx Mpps (min-max)" "vs off" captured missed
printf -- '------+----------+-----------------------------+----------+--------------+-------------\n'
flip=0
for r in $(seq 1 "$ROUNDS"); do
    # Each round starts with the next variant in turn (off blocked devnull, blocked devnull off, ...).
    set -- $VARIANTS
    order=
    for k in 0 1 2; do i=$(( (flip + k) % 3 + 1 )); order="$order ${!i}"; done
    flip=$(( (flip + 1) % 3 ))
    for v in $order; do
        read -r med min max n captured missed < <(run "$v")
        MED[$r.$v]=$med
        ratio=$(awk -v a="$med" -v b="${MED[$r.off]:-0}" 'BEGIN{ if (b>0) printf "%.3f", a/b; else print "-" }')
        printf '%5s | %-8s | %6.2f (%5.2f-%5.2f) n=%-2s | %8s | %12s | %12s\n' \
            "$r" "$v" "$med" "$min" "$max" "$n" "$ratio" "$captured" "$missed"
    done
done

# The machine swings between a fast and a slow state: compare the same quantile of all windows.
# pct FILE -> "p20 p50 p80 n" (Mpps)
pct() {
    sort -g "$1" | awk '{a[NR]=$1} END{ if (NR==0) {print "0 0 0 0"; exit}
        i20=int(0.2*(NR-1)+0.5)+1; i50=int(0.5*(NR-1)+0.5)+1; i80=int(0.8*(NR-1)+0.5)+1;
        printf "%.3f %.3f %.3f %d\n", a[i20]/1e6, a[i50]/1e6, a[i80]/1e6, NR }'
}
echo
echo "all 1-s windows of each variant: Mpps p20 / p50 / p80 (p80: fast state, p20: slow), and over off"
read -r o20 o50 o80 _ < <(touch "$DIR/samples.off"; pct "$DIR/samples.off")
for v in $VARIANTS; do
    touch "$DIR/samples.$v"
    read -r a b c n < <(pct "$DIR/samples.$v")
    awk -v v="$v" -v a="$a" -v b="$b" -v c="$c" -v n="$n" -v x="$o20" -v y="$o50" -v z="$o80" 'BEGIN{
        printf "%-8s %6.2f %6.2f %6.2f n=%-3d | %s %s %s\n", v, a, b, c, n,
        (x>0)? sprintf("%.3f", a/x) : "-", (y>0)? sprintf("%.3f", b/y) : "-", (z>0)? sprintf("%.3f", c/z) : "-" }'
done
