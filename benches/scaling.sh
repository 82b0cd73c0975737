#!/usr/bin/env bash
# Multi-queue scaling of memif (memnic<->memnic, N queue pairs) and MEMNIC (N devices): N = 1, 2,
# 4, 8 queue pairs, each on its own lcore on each side, rings and buffers on that lcore's node
# (--ring-bind-lcpu). Made for a machine lent for minutes (16 cores): one call, no build, no
# network; it needs only a release build of memnic.
#
#   benches/scaling.sh [OUT_DIR]        (env: MEMNIC=path/to/memnic, SIZES=64,1518, ROUNDS=2,
#                                        SECONDS_PER_RUN=4, QUEUES=1,2,4,8 to override the choice,
#                                        VERIFY=0 to leave out the verified run)
#
# Picks one CPU per physical core (the first thread of each), the cores of one NUMA node first:
# side A (memif server, MEMNIC host) takes the first N of them, side B the next N. The most
# queue pairs is the largest power of two up to half the cores (8 on 16). Writes machine.txt,
# verify.json (an 8-queue verified memif run: nothing lost, corrupted or reordered at scale),
# memif.txt and memnic.txt (the bench tables: ratio = Mpps over N times the x1 rate, 1.00 is
# perfect scaling; "limit (2 copies) xN" is N bare rings side by side, each pair's "of limit" is
# over the limit with as many rings; MEMNIC's is over "limit (MEMNIC slots) xN", its own ring
# bare) under OUT_DIR (default: $OUT, else ./scaling-out).
set -euo pipefail
OUT_DIR=${1:-${OUT:-scaling-out}}
MEMNIC=${MEMNIC:-target/release/memnic}
SIZES=${SIZES:-64,1518}
ROUNDS=${ROUNDS:-2}
SECS=${SECONDS_PER_RUN:-4}
mkdir -p "$OUT_DIR"
[ -x "$MEMNIC" ] || { echo "scaling.sh: $MEMNIC is not an executable memnic (cargo build --release first)" >&2; exit 2; }

# One CPU per core, ordered by node then core: "cpu" lines of `lscpu -p=CPU,CORE,NODE`.
mapfile -t CPUS < <(lscpu -p=CPU,CORE,NODE | grep -v '^#' | sort -t, -k3,3n -k2,2n -k1,1n |
    awk -F, '!seen[$2]++ { print $1 }')
CORES=${#CPUS[@]}
{
    date -u
    case "$(uname -r)" in
        4.4.0) echo "kernel: 4.4.0, gVisor's: its CPU pinning and scheduling are its own" ;;
        *) echo "kernel: $(uname -r)" ;;
    esac
    grep -E 'Cpus_allowed_list|Mems_allowed_list' /proc/self/status || true
    echo "nproc: $(nproc), cores used (one thread each): $CORES: ${CPUS[*]}"
    lscpu | grep -E 'Model name|Socket|Core|Thread|NUMA|MHz|L2|L3' || true
} | tee "$OUT_DIR/machine.txt"

if [ -z "${QUEUES:-}" ]; then
    QUEUES=1
    n=2
    while [ $((2 * n)) -le "$CORES" ] && [ "$n" -le 8 ]; do QUEUES="$QUEUES,$n"; n=$((2 * n)); done
fi
MOST=${QUEUES##*,}
if [ $((2 * MOST)) -gt "$CORES" ]; then
    echo "scaling.sh: --queues up to $MOST needs $((2 * MOST)) cores, this machine has $CORES" >&2
    exit 2
fi
join() { local IFS=,; echo "$*"; }
SIDE_A=$(join "${CPUS[@]:0:MOST}")
SIDE_B=$(join "${CPUS[@]:MOST:MOST}")
echo "queues $QUEUES; side A CPUs $SIDE_A, side B CPUs $SIDE_B" | tee -a "$OUT_DIR/machine.txt"

# Correctness at the widest: MOST queue pairs, the verifier on every frame.
if [ "${VERIFY:-1}" != 0 ]; then
SOCK=$(mktemp -u /tmp/scaling-XXXXXX.sock)
"$MEMNIC" testpmd -l "$SIDE_A" --vdev "memif0,role=server,socket=$SOCK" --rxq "$MOST" --txq "$MOST" \
    --ring-bind-lcpu --forward-mode rxonly --verify --txpkts 1000 --duration 6 --json \
    > "$OUT_DIR/verify.json" 2> "$OUT_DIR/verify-server.err" &
server=$!
for _ in $(seq 100); do [ -S "$SOCK" ] && break; sleep 0.1; done
"$MEMNIC" testpmd -l "$SIDE_B" --vdev "memif0,role=client,socket=$SOCK" --rxq "$MOST" --txq "$MOST" \
    --ring-bind-lcpu --forward-mode txonly --verify --txpkts 1000 --duration 3 > /dev/null ||
    echo "scaling.sh: the verified run's client exited with $?" | tee -a "$OUT_DIR/machine.txt"
wait "$server" || echo "scaling.sh: the verified run's server exited with $?" | tee -a "$OUT_DIR/machine.txt"
rm -f "$SOCK"
fi

common=(--queues "$QUEUES" --sizes "$SIZES" --rounds "$ROUNDS" --seconds "$SECS" --cpus "$SIDE_A/$SIDE_B" --quiet)
"$MEMNIC" bench memif --peer memnic "${common[@]}" | tee "$OUT_DIR/memif.txt"
"$MEMNIC" bench memnic "${common[@]}" | tee "$OUT_DIR/memnic.txt"
