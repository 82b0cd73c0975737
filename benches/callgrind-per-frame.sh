#!/usr/bin/env bash
# Instructions a frame on one side of a pair, counted by callgrind: deterministic, so it does not
# care about this machine's fast and slow states (ab-builds.sh measures the wall clock).
#
#   benches/callgrind-per-frame.sh BIN PAIR SIDE SIZE [KEEP_DIR]
#   PAIR: memif | memif-zc | memnic-h2g     SIDE: tx | rx     SIZE: frame bytes
#
# The measured side runs under callgrind, the other natively, so the measured side always has
# work (a full ring to read, or room to write) and idle polls do not pollute the count.
# - tx: (Ir of a 9-s run - Ir of a 3-s run) / (frames of the 9-s run - frames of the 3-s run),
#   which cancels start-up. Run it two or three times: a slow start of either run moves the
#   difference (seen: 247, 251 and once 454 for one binary); CG_DEBUG=1 prints both runs.
# - rx: instrumentation is on only while the sender runs (callgrind_control -i), and the
#   receiver is stopped with SIGINT (testpmd prints its totals).
# With KEEP_DIR, the callgrind output of the (last) measured run is kept there as
# PAIR-SIDE-SIZE.out, its frame count as PAIR-SIDE-SIZE.frames (for callgrind_annotate).
# Needs valgrind. memnic-g2h is not offered: the guest must start after the host's region.
set -euo pipefail
[ $# -ge 4 ] || { echo "usage: callgrind-per-frame.sh BIN PAIR SIDE SIZE [KEEP_DIR]" >&2; exit 2; }
BIN=$(realpath "$1"); PAIR=$2; SIDE=$3; SIZE=$4; KEEP=${5:-}
command -v valgrind >/dev/null || { echo "callgrind-per-frame.sh: valgrind is not installed" >&2; exit 2; }
case $PAIR in memif|memif-zc|memnic-h2g) ;; *) echo "callgrind-per-frame.sh: unknown pair '$PAIR' (memif, memif-zc, memnic-h2g)" >&2; exit 2 ;; esac
case $SIDE in tx|rx) ;; *) echo "callgrind-per-frame.sh: side must be tx or rx, not '$SIDE'" >&2; exit 2 ;; esac
D=$(mktemp -d)
trap 'pkill -INT -P $$ 2>/dev/null || true; rm -rf "$D"; rm -f /dev/shm/cg-$$' EXIT

# one T: runs the pair with the measured side under callgrind for T seconds; prints "frames Ir"
one() {
    local T=$1 rxd zc="" p j k
    rxd=$((T + 4)); [ "$SIDE" = rx ] && rxd=1000
    [ "$PAIR" = memif-zc ] && zc=",zero-copy=yes"
    local cg=(valgrind --tool=callgrind "--callgrind-out-file=$D/cg.out")
    local rx tx
    if [ "$PAIR" = memnic-h2g ]; then
        rx=(testpmd -l 1 --vdev "memnic0,path=cg-$$,role=guest" --forward-mode=rxonly --duration "$rxd" --json)
        tx=(testpmd -l 0 --vdev "memnic0,path=cg-$$,role=host" --forward-mode=txonly --txpkts="$SIZE" --duration "$T" --json)
    else
        rx=(testpmd -l 0 --vdev "memif0,role=server,socket=$D/sock" --forward-mode=rxonly --duration "$rxd" --json)
        tx=(testpmd -l 1 --vdev "memif0,role=client,socket=$D/sock$zc" --forward-mode=txonly --txpkts="$SIZE" --duration "$T" --json)
    fi
    rm -f "$D/cg.out" "$D/sock" /dev/shm/cg-$$
    if [ "$SIDE" = rx ]; then
        [ "$PAIR" = memnic-h2g ] && { echo "callgrind-per-frame.sh: rx of memnic-h2g is not offered (the guest starts after the host)" >&2; exit 2; }
        "${cg[@]}" --instr-atstart=no "$BIN" "${rx[@]}" >"$D/rx.json" 2>"$D/rx.err" & p=$!
        sleep 5
        callgrind_control -i on $p >/dev/null
        "$BIN" "${tx[@]}" >"$D/tx.json" 2>"$D/tx.err"
        callgrind_control -i off $p >/dev/null
        kill -INT $p; wait $p || true
        j=$D/rx.json; k=rx_packets
    elif [ "$PAIR" = memnic-h2g ]; then
        "${cg[@]}" "$BIN" "${tx[@]}" >"$D/tx.json" 2>"$D/tx.err" & p=$!
        sleep 3
        "$BIN" "${rx[@]}" >"$D/rx.json" 2>"$D/rx.err" || true
        wait $p || true
        j=$D/tx.json; k=tx_packets
    else
        "$BIN" "${rx[@]}" >"$D/rx.json" 2>"$D/rx.err" & p=$!
        sleep 0.5
        "${cg[@]}" "$BIN" "${tx[@]}" >"$D/tx.json" 2>"$D/tx.err" || true
        wait $p || true
        j=$D/tx.json; k=tx_packets
    fi
    local frames ir
    # (|| true: head and grep -m1 close their pipes early, which pipefail would count.)
    frames=$(grep -o "\"$k\":[0-9]*" "$j" | head -1 | cut -d: -f2 || true)
    ir=$(callgrind_annotate "$D/cg.out" 2>/dev/null | grep -m1 "PROGRAM TOTALS" | awk '{gsub(",","",$1); print $1}' || true)
    [ -n "$frames" ] && [ -n "$ir" ] || { echo "callgrind-per-frame.sh: a run printed no totals (see $D)" >&2; trap - EXIT; exit 1; }
    if [ -n "$KEEP" ]; then
        mkdir -p "$KEEP"
        cp "$D/cg.out" "$KEEP/$PAIR-$SIDE-$SIZE.out"
        echo "$frames" >"$KEEP/$PAIR-$SIDE-$SIZE.frames"
    fi
    echo "$frames $ir"
}

if [ "$SIDE" = rx ]; then
    read -r f i < <(one 6)
    awk -v f="$f" -v i="$i" -v p="$PAIR" -v s="$SIZE" -v b="$(basename "$BIN")" \
        'BEGIN{ printf "%s rx %s B %s: %.1f instructions a frame (%d frames)\n", p, s, b, i / f, f }'
else
    read -r f1 i1 < <(one 3); [ -n "${CG_DEBUG:-}" ] && echo "3 s: $f1 frames, $i1 Ir" >&2
    read -r f2 i2 < <(one 9); [ -n "${CG_DEBUG:-}" ] && echo "9 s: $f2 frames, $i2 Ir" >&2
    awk -v f1="$f1" -v i1="$i1" -v f2="$f2" -v i2="$i2" -v p="$PAIR" -v s="$SIZE" -v b="$(basename "$BIN")" \
        'BEGIN{ if (f2 <= f1) { print "callgrind-per-frame.sh: the 9-s run sent no more frames than the 3-s one" > "/dev/stderr"; exit 1 }
                printf "%s tx %s B %s: %.1f instructions a frame (%d frames between the runs)\n", p, s, b, (i2 - i1) / (f2 - f1), f2 - f1 }'
fi
