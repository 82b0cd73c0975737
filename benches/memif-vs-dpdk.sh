#!/usr/bin/env bash
# (`memnic bench` runs this comparison too, with a table, --json and --svg; see the README.)
# memif txonly -> rxonly, side by side on this machine: DPDK<->DPDK, memnic<->memnic, memnic
# with DPDK in both roles (all copy mode), and DPDK<->DPDK and memnic<->memnic with a zero-copy
# client. The server receives (started first), the client sends; one CPU each (server on CPU 0,
# client on CPU 1). Every pair runs once per round, rounds alternate all pairs and sizes (this
# machine's speed drifts by tens of percent over minutes). Mpps = median of the receiver's 1-s
# Rx-pps samples of all rounds (the first and last, partial, of each run dropped), with min-max;
# copy pairs are compared with DPDK<->DPDK, zero-copy pairs with DPDK's zero-copy client.
#
#   benches/memif-vs-dpdk.sh [--seconds N] [--rounds N] [--sizes "64 128 ..."] [--json]
# Needs dpdk-testpmd (apt-get install dpdk-dev librte-net-memif23).
set -euo pipefail
T=6
ROUNDS=3
SIZES="64 128 256 512 1024 1518"
JSON=0
while [ $# -gt 0 ]; do
    case "$1" in
        --seconds) T=$2; shift 2 ;;
        --sizes) SIZES=$2; shift 2 ;;
        --rounds) ROUNDS=$2; shift 2 ;;
        --json) JSON=1; shift ;;
        *) echo "memif-vs-dpdk.sh: unknown option '$1' (use --seconds N, --rounds N, --sizes \"64 128\", --json)" >&2; exit 2 ;;
    esac
done
command -v dpdk-testpmd >/dev/null || { echo "memif-vs-dpdk.sh: dpdk-testpmd is not installed (apt-get install dpdk-dev librte-net-memif23)" >&2; exit 2; }
cd "$(dirname "$0")/.."
cargo build --release -q
OURS=$PWD/target/release/memnic
DIR=$(mktemp -d)
SOCK=$DIR/memif.sock
trap 'pkill -INT -P $$ 2>/dev/null || true; rm -rf "$DIR"' EXIT
EAL="--no-huge -m 512 --no-pci"
APP="--nb-cores=1 --total-num-mbufs=32768 -a --stats-period 1"

server() { # impl log
    if [ "$1" = dpdk ]; then
        timeout -s INT $((T + 4)) dpdk-testpmd $EAL --lcores=0@0,1@0 --file-prefix s$$ \
            --vdev=net_memif0,role=server,socket=$SOCK,socket-abstract=no -- $APP --forward-mode=rxonly >"$2" 2>&1
    else
        timeout -s INT $((T + 6)) $OURS testpmd -l 0 --vdev memif0,role=server,socket=$SOCK \
            --forward-mode=rxonly --stats-period 1 --duration $((T + 3)) >"$2" 2>&1
    fi
}
client() { # impl size log   (impl: dpdk, memnic; dpdk-zc, memnic-zc: zero-copy clients)
    if [ "$1" = dpdk ] || [ "$1" = dpdk-zc ]; then
        local zc="" seg=""
        [ "$1" = dpdk-zc ] && zc=",zero-copy=yes" && seg="--single-file-segments"
        timeout -s INT "$T" dpdk-testpmd $EAL $seg --lcores=0@1,1@1 --file-prefix c$$ \
            --vdev=net_memif0,role=client,socket=$SOCK,socket-abstract=no$zc -- $APP --forward-mode=txonly --txpkts="$2" >"$3" 2>&1 || true
    else
        local zc=no
        [ "$1" = memnic-zc ] && zc=yes
        timeout -s INT $((T + 3)) $OURS testpmd -l 1 --vdev memif0,role=client,socket=$SOCK,zero-copy=$zc \
            --forward-mode=txonly --txpkts="$2" --duration "$T" >"$3" 2>&1 || true
    fi
}
# pair SERVER_IMPL CLIENT_IMPL SIZE SAMPLES: appends the receiver's Rx-pps samples to SAMPLES
pair() {
    rm -f "$SOCK"
    server "$1" "$DIR/s.log" &
    local sp=$!
    sleep 2
    client "$2" "$3" "$DIR/c.log"
    wait $sp || true
    grep -a 'Rx-pps:' "$DIR/s.log" | awk '$2>0{print $2}' | head -n -1 | tail -n +2 >>"$4"
}
# stats FILE -> "median min max n" (Mpps)
stats() {
    sort -n "$1" | awk '{a[NR]=$1} END{ if (NR==0) {print "0 0 0 0"; exit}
             m = (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2;
             printf "%.2f %.2f %.2f %d\n", m/1e6, a[1]/1e6, a[NR]/1e6, NR }'
}

PAIRS="dpdk:dpdk memnic:memnic memnic:dpdk dpdk:memnic dpdk:dpdk-zc memnic:memnic-zc"
declare -A R
for r in $(seq "$ROUNDS"); do
    [ -t 2 ] && echo "round $r of $ROUNDS" >&2
    for s in $SIZES; do
        for p in $PAIRS; do
            pair "${p%%:*}" "${p##*:}" "$s" "$DIR/samples.${p/:/-}.$s"
        done
    done
done
for s in $SIZES; do
    for p in $PAIRS; do
        touch "$DIR/samples.${p/:/-}.$s"
        R[$p:$s]=$(stats "$DIR/samples.${p/:/-}.$s")
    done
done

if [ $JSON = 1 ]; then
    printf '['; sep=
    for s in $SIZES; do for p in $PAIRS; do
        set -- ${R[$p:$s]}
        printf '%s{"server":"%s","client":"%s","size":%s,"mpps":%s,"min":%s,"max":%s,"samples":%s}' "$sep" "${p%%:*}" "${p##*:}" "$s" "$1" "$2" "$3" "$4"
        sep=,
    done; done
    printf ']\n'
    exit 0
fi
echo "memif txonly -> rxonly, server (receiver) on CPU 0, client (sender) on CPU 1, ${T} s per run, $ROUNDS rounds"
echo "Mpps: median (min-max) of all 1-s samples; copy pairs: ratio to DPDK<->DPDK; zero copy: ratio to DPDK's zc client"
printf '%6s | %-20s | %-27s | %-27s | %-27s | %-20s | %-27s\n' size "DPDK srv <- DPDK cli" "memnic srv <- memnic cli" "memnic srv <- DPDK cli" "DPDK srv <- memnic cli" "DPDK <- DPDK zc cli" "memnic <- memnic zc cli"
cell() { # pair size base
    set -- ${R[$1:$2]} "$3"
    local ratio
    ratio=$(awk -v a="$1" -v b="$5" 'BEGIN{ printf "%.2fx", (b>0)? a/b : 0 }')
    printf ' | %5.2f (%5.2f-%5.2f) %6s' "$1" "$2" "$3" "$ratio"
}
for s in $SIZES; do
    set -- ${R[dpdk:dpdk:$s]}; base=$1
    line=$(printf '%6s | %5.2f (%5.2f-%5.2f)  ' "$s" "$1" "$2" "$3")
    for p in memnic:memnic memnic:dpdk dpdk:memnic; do
        line+=$(cell "$p" "$s" "$base")
    done
    set -- ${R[dpdk:dpdk-zc:$s]}; zbase=$1
    line+=$(printf ' | %5.2f (%5.2f-%5.2f)  ' "$1" "$2" "$3")
    line+=$(cell memnic:memnic-zc "$s" "$zbase")
    echo "$line"
done
