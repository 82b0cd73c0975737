#!/usr/bin/env bash
# memif txonly -> rxonly, side by side on this machine: DPDK<->DPDK, memnic<->memnic (copy and
# zero-copy client), and memnic
# with DPDK in both roles. The server receives (started first), the client sends; one CPU each
# (server on CPU 0, client on CPU 1). Mpps = median of the receiver's 1-s Rx-pps samples (first
# two and last one dropped), with min-max; ratios against DPDK<->DPDK.
#
#   benches/memif-vs-dpdk.sh [--seconds N] [--sizes "64 128 ..."] [--json]
# Needs dpdk-testpmd (apt-get install dpdk-dev librte-net-memif23).
set -euo pipefail
T=6
SIZES="64 128 256 512 1024 1518"
JSON=0
while [ $# -gt 0 ]; do
    case "$1" in
        --seconds) T=$2; shift 2 ;;
        --sizes) SIZES=$2; shift 2 ;;
        --json) JSON=1; shift ;;
        *) echo "memif-vs-dpdk.sh: unknown option '$1' (use --seconds N, --sizes \"64 128\", --json)" >&2; exit 2 ;;
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
client() { # impl size log   (impl: dpdk, memnic, or memnic-zc for our zero-copy client)
    if [ "$1" = dpdk ]; then
        timeout -s INT "$T" dpdk-testpmd $EAL --lcores=0@1,1@1 --file-prefix c$$ \
            --vdev=net_memif0,role=client,socket=$SOCK,socket-abstract=no -- $APP --forward-mode=txonly --txpkts="$2" >"$3" 2>&1 || true
    else
        local zc=no
        [ "$1" = memnic-zc ] && zc=yes
        timeout -s INT $((T + 3)) $OURS testpmd -l 1 --vdev memif0,role=client,socket=$SOCK,zero-copy=$zc \
            --forward-mode=txonly --txpkts="$2" --duration "$T" >"$3" 2>&1 || true
    fi
}
# pair SERVER_IMPL CLIENT_IMPL SIZE -> "median min max n" (Mpps)
pair() {
    rm -f "$SOCK"
    server "$1" "$DIR/s.log" &
    local sp=$!
    sleep 2
    client "$2" "$3" "$DIR/c.log"
    wait $sp || true
    grep -a 'Rx-pps:' "$DIR/s.log" | awk '$2>0{print $2}' | head -n -1 | tail -n +3 | sort -n |
        awk '{a[NR]=$1} END{ if (NR==0) {print "0 0 0 0"; exit}
             m = (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2;
             printf "%.2f %.2f %.2f %d\n", m/1e6, a[1]/1e6, a[NR]/1e6, NR }'
}

PAIRS="dpdk:dpdk memnic:memnic memnic:dpdk dpdk:memnic memnic:memnic-zc"
declare -A R
for s in $SIZES; do
    for p in $PAIRS; do
        R[$p:$s]=$(pair "${p%%:*}" "${p##*:}" "$s")
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
echo "memif txonly -> rxonly, server (receiver) on CPU 0, client (sender) on CPU 1, ${T} s per run; Mpps median (min-max), ratio to DPDK<->DPDK"
printf '%6s | %-20s | %-27s | %-27s | %-27s | %-27s\n' size "DPDK srv <- DPDK cli" "memnic srv <- memnic cli" "memnic srv <- DPDK cli" "DPDK srv <- memnic cli" "memnic srv <- memnic zc cli"
for s in $SIZES; do
    set -- ${R[dpdk:dpdk:$s]}; base=$1
    line=$(printf '%6s | %5.2f (%5.2f-%5.2f)  ' "$s" "$1" "$2" "$3")
    for p in memnic:memnic memnic:dpdk dpdk:memnic memnic:memnic-zc; do
        set -- ${R[$p:$s]}
        ratio=$(awk -v a="$1" -v b="$base" 'BEGIN{ printf "%.2fx", (b>0)? a/b : 0 }')
        line+=$(printf ' | %5.2f (%5.2f-%5.2f) %6s' "$1" "$2" "$3" "$ratio")
    done
    echo "$line"
done
