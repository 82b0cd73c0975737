#!/usr/bin/env bash
# (`memnic bench` runs this comparison too, with a table, --json and --svg; see the README.)
# vhost-user backends side by side: DPDK's net_vhost and ours, with the same frontend (DPDK
# 22.11's virtio-user) in every run. Both directions: dequeue (virtio-user txonly -> backend
# rxonly: the guest's tx ring) and enqueue (backend txonly -> virtio-user rxonly: the guest's
# rx ring, where DPDK is slowest), split and packed rings, each size; and with --dirs io, VM to
# VM: two backend ports in io mode forwarding to each other, in front of them one virtio-user
# testpmd with two ports in io mode forwarding back (a loop of 256 frames started with
# tx_first), counted by both ports' RX-packets (frames the backend forwarded: a dequeue and an
# enqueue each; the frontend only moves mbuf pointers). The backend runs on
# CPU 1, virtio-user on CPU 0, one lcore each.
#
# Every figure comes from the frontend's counters (its TX-packets for dequeue: the ring holds
# 256, so what it got in is what the backend took; its RX-packets for enqueue), stamped with
# this script's clock as the lines arrive (DPDK prints every 2 s, late when its stats thread
# shares a CPU): each window between two stamped lines is one sample. Runs alternate the two
# backends (A B B A ...) over all cells, so both see the same mix of this machine's fast and
# slow states; the table gives each backend's 20th/50th/80th percentile of its window rates
# (p80 is the fast state, p20 the slow one) and ours/DPDK at each.
#
#   benches/vhost-vs-dpdk.sh [--seconds N] [--rounds N] [--sizes "64 512 1518"]
#                            [--rings "split packed"] [--dirs "deq enq io"] [--json]
#                            [--ours BIN] [--baseline BIN] [--zero-copy]
# --zero-copy: a third backend in the rotation, ours with dequeue-zero-copy=1 (dequeue only:
# use it with --dirs deq or io), and the table's last columns are zero copy / copy and / DPDK;
# --zc-min-len N: its dequeue-zero-copy-min-len (default 0: every frame uncopied, to find the
# break-even).
# VU_OPTS (environment): more virtio-user devargs for every run, e.g. VU_OPTS=,in_order=0.
# --ours: our memnic binary (default: a fresh release build); --baseline: another memnic
# binary in DPDK's place (an A/B of two builds; its column is then headed "DPDK" still).
# Needs dpdk-testpmd with the vhost and virtio PMDs (apt-get install dpdk-dev
# librte-net-vhost23 librte-net-virtio23).
set -euo pipefail
T=12
ROUNDS=3
SIZES="64 512 1518"
RINGS="split packed"
DIRS="deq enq"
JSON=0
OURS=
BASE=
IMPLS="dpdk memnic"
ZC_MIN=0
while [ $# -gt 0 ]; do
    case "$1" in
        --seconds) T=$2; shift 2 ;;
        --rounds) ROUNDS=$2; shift 2 ;;
        --sizes) SIZES=$2; shift 2 ;;
        --rings) RINGS=$2; shift 2 ;;
        --dirs) DIRS=$2; shift 2 ;;
        --json) JSON=1; shift ;;
        --ours) OURS=$(realpath "$2"); shift 2 ;;
        --baseline) BASE=$(realpath "$2"); shift 2 ;;
        --zero-copy) IMPLS="dpdk memnic memnic-zc"; shift ;;
        --zc-min-len) ZC_MIN=$2; shift 2 ;;
        *) echo "vhost-vs-dpdk.sh: unknown option '$1' (use --seconds N, --rounds N, --sizes \"64 1518\", --rings \"split packed\", --dirs \"deq enq io\", --json)" >&2; exit 2 ;;
    esac
done
command -v dpdk-testpmd >/dev/null || { echo "vhost-vs-dpdk.sh: dpdk-testpmd is not installed (apt-get install dpdk-dev librte-net-vhost23 librte-net-virtio23)" >&2; exit 2; }
cd "$(dirname "$0")/.."
if [ -z "$OURS" ]; then
    cargo build --release -q
    OURS=$PWD/target/release/memnic
fi
DIR=$(mktemp -d)
SOCK=$DIR/vhost.sock
trap 'pkill -INT -P $$ 2>/dev/null || true; rm -rf "$DIR"' EXIT
EAL="--no-huge -m 1024 --no-pci"
# Seconds the frontend is given to start before its T seconds of traffic: two 1-GiB no-huge EAL
# start-ups side by side (DPDK's backend's and the frontend's) take about 4 s here, and with T
# counted from the frontend's launch a 10-s run of DPDK's net_vhost kept 2 statistics lines, no
# window once the first and the last are dropped.
STARTUP=5
APP="--nb-cores=1 --total-num-mbufs=32768 -a --stats-period 1"

backend() { # impl mode size (mode io: two ports, $SOCK and ${SOCK}1, forwarding to each other)
    local ours dpdk=(--vdev=net_vhost0,iface=$SOCK,queues=1) zc=
    [ "$1" = memnic-zc ] && zc=",dequeue-zero-copy=1,dequeue-zero-copy-min-len=$ZC_MIN"
    ours=(--vdev "vhost0,iface=$SOCK$zc")
    if [ "$2" = io ]; then
        ours+=(--vdev "vhost1,iface=${SOCK}1$zc")
        dpdk+=(--vdev=net_vhost1,iface=${SOCK}1,queues=1)
    fi
    if [ "$1" = dpdk ] && [ -n "$BASE" ]; then
        timeout -s INT $((T + 10)) "$BASE" testpmd -l 1 "${ours[@]}" \
            --forward-mode="$2" --txpkts="$3" --duration $((T + 8)) >"$DIR/b.log" 2>&1
    elif [ "$1" = dpdk ]; then
        timeout -s INT $((T + 10)) dpdk-testpmd $EAL --lcores=0@1,1@1 --file-prefix b$$ \
            "${dpdk[@]}" -- $APP --forward-mode="$2" --txpkts="$3" \
            >"$DIR/b.log" 2>&1
    else
        timeout -s INT $((T + 10)) "$OURS" testpmd -l 1 "${ours[@]}" \
            --forward-mode="$2" --txpkts="$3" --duration $((T + 8)) >"$DIR/b.log" 2>&1
    fi
}
# frontend ring mode size: virtio-user for T seconds; prints "seconds count" for each
# statistics line of its port (count: TX-packets for txonly, RX-packets for rxonly). Mode io
# (the VM-to-VM loop): two ports in io mode at testpmd's prompt, `start tx_first 4` (4 bursts of
# 32 per port: 256 frames go round, fewer than the rings hold, so none is dropped), then
# `show port stats all` every second from a second after it; count: both ports' RX-packets.
# (stdbuf: testpmd's answers at the prompt are not flushed line by line into a pipe; its
# periodic statistics are.)
frontend() {
    local packed=0 key=RX-packets ports=1
    [ "$1" = packed ] && packed=1
    [ "$2" = txonly ] && key=TX-packets
    local vdevs=(--vdev=net_virtio_user0,path=$SOCK,queues=1,packed_vq=$packed${VU_OPTS:-}) app=($APP)
    if [ "$2" = io ]; then
        vdevs+=(--vdev=net_virtio_user1,path=${SOCK}1,queues=1,packed_vq=$packed${VU_OPTS:-})
        ports=2
        app=(--nb-cores=1 --total-num-mbufs=32768 -i)
    fi
    {
        if [ "$2" = io ]; then
            sleep 3
            echo "start tx_first 4"
            while sleep 1; do echo "show port stats all"; done
        fi
    } | timeout -s INT "$((T + STARTUP))" stdbuf -oL dpdk-testpmd $EAL --single-file-segments --lcores=0@0,1@0 \
        --file-prefix f$$ "${vdevs[@]}" \
        -- "${app[@]}" --no-flush-rx --forward-mode="$2" --txpkts="$3" 2>&1 |
        while IFS= read -r line; do
            case $line in
                # (The port statistics' lines, which name the bytes; not the totals printed
                # at exit.)
                *"$key:"*"-bytes:"*) set -- $line; echo "$(date +%s.%N) $2" ;;
            esac
        done |
        # One statistics print has a line per port: their sum, stamped at the last.
        awk -v n=$ports '{ sum += $2 } NR % n == 0 { print $1, sum; sum = 0; fflush() }'
}
# listening PATH: a unix socket is listening at PATH
listening() { ss -xlnH 2>/dev/null | awk -v p="$1" '$5 == p { f = 1 } END { exit !f }'; }
# one IMPL RING DIR SIZE: appends window rates (pps) to $DIR/samples.IMPL.RING.DIR.SIZE
one() {
    local bmode=rxonly fmode=txonly
    [ "$3" = enq ] && bmode=txonly fmode=rxonly
    [ "$3" = io ] && bmode=io fmode=io
    rm -f "$SOCK" "${SOCK}1"
    backend "$1" "$bmode" "$4" &
    local bp=$!
    # Listening, not just there: a virtio-user that cannot connect gets no port and the run
    # counts nothing, so the frontend starts only once a backend accepts connections.
    for _ in $(seq 100); do listening "$SOCK" && { [ "$3" != io ] || listening "${SOCK}1"; } && break; sleep 0.1; done
    frontend "$2" "$fmode" "$4" >"$DIR/f.stamps" || true
    kill -INT $bp 2>/dev/null || true
    wait $bp 2>/dev/null || true
    # Windows between stamped cumulative counts; the first (start-up) and, of the periodic
    # statistics, the last dropped (io's prints answer our own commands, the loop already
    # running at the first).
    local last=1
    [ "$3" = io ] && last=0
    awk 'NR>1 && $1>t { r=($2-c)/($1-t); if (r>0) print r } { t=$1; c=$2 }' "$DIR/f.stamps" |
        head -n -$last | tail -n +2 >>"$DIR/samples.$1.$2.$3.$4"
}
# pct FILE -> "p20 p50 p80 n" (Mpps)
pct() {
    sort -g "$1" | awk '{a[NR]=$1} END{ if (NR==0) {print "0 0 0 0"; exit}
        i20=int(0.2*(NR-1)+0.5)+1; i50=int(0.5*(NR-1)+0.5)+1; i80=int(0.8*(NR-1)+0.5)+1;
        printf "%.2f %.2f %.2f %d\n", a[i20]/1e6, a[i50]/1e6, a[i80]/1e6, NR }'
}

flip=0
for r in $(seq "$ROUNDS"); do
    for s in $SIZES; do for ring in $RINGS; do for d in $DIRS; do
        [ -t 2 ] && printf '\rround %d of %d: %s %s %s B   ' "$r" "$ROUNDS" "$ring" "$d" "$s" >&2
        # Each cell starts with the next backend in turn (A B, B A; or A B C, B C A, C A B).
        set -- $IMPLS
        n=$#
        order=
        for k in $(seq 0 $((n - 1))); do
            i=$(( (flip + k) % n + 1 ))
            order="$order ${!i}"
        done
        flip=$(( (flip + 1) % n ))
        for impl in $order; do one "$impl" "$ring" "$d" "$s"; done
    done; done; done
done
[ -t 2 ] && echo >&2

declare -A R
for s in $SIZES; do for ring in $RINGS; do for d in $DIRS; do for impl in $IMPLS; do
    f="$DIR/samples.$impl.$ring.$d.$s"; touch "$f"
    R[$impl.$ring.$d.$s]=$(pct "$f")
done; done; done; done

if [ $JSON = 1 ]; then
    printf '['; sep=
    for s in $SIZES; do for ring in $RINGS; do for d in $DIRS; do for impl in $IMPLS; do
        set -- ${R[$impl.$ring.$d.$s]}
        printf '%s{"backend":"%s","ring":"%s","dir":"%s","size":%s,"p20":%s,"p50":%s,"p80":%s,"samples":%s}' \
            "$sep" "$impl" "$ring" "$d" "$s" "$1" "$2" "$3" "$4"
        sep=,
    done; done; done; done
    printf ']\n'
    exit 0
fi
echo "vhost-user backend (CPU 1) <-> DPDK virtio-user (CPU 0), $T s per run, $ROUNDS rounds, runs alternating"
echo "deq: virtio-user txonly -> backend rxonly; enq: backend txonly -> virtio-user rxonly; io: a loop, virtio-user io <-> backend io, two ports"
echo "Mpps at the 20th / 50th / 80th percentile of the frontend's stamped ~2-s windows (p80: fast state, p20: slow)"
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{ printf "%.2f", (b>0)? a/b : 0 }'; }
if [ "$IMPLS" != "dpdk memnic" ]; then
    printf '%-6s %-3s %5s | %-20s | %-20s | %-20s | %-14s | %-14s\n' ring dir size "DPDK p20/p50/p80" \
        "memnic copy" "memnic zero copy" "zc/copy" "zc/DPDK"
    for s in $SIZES; do for ring in $RINGS; do for d in $DIRS; do
        set -- ${R[dpdk.$ring.$d.$s]} ${R[memnic.$ring.$d.$s]} ${R[memnic-zc.$ring.$d.$s]}
        printf '%-6s %-3s %5s | %5.2f %5.2f %5.2f n=%-2s | %5.2f %5.2f %5.2f n=%-2s | %5.2f %5.2f %5.2f n=%-2s | %s %s %s | %s %s %s\n' \
            "$ring" "$d" "$s" "$1" "$2" "$3" "$4" "$5" "$6" "$7" "$8" "$9" "${10}" "${11}" "${12}" \
            "$(ratio "$9" "$5")" "$(ratio "${10}" "$6")" "$(ratio "${11}" "$7")" \
            "$(ratio "$9" "$1")" "$(ratio "${10}" "$2")" "$(ratio "${11}" "$3")"
    done; done; done
    exit 0
fi
printf '%-6s %-3s %5s | %-20s | %-20s | %-17s\n' ring dir size "DPDK p20/p50/p80" "memnic p20/p50/p80" "memnic/DPDK"
for s in $SIZES; do for ring in $RINGS; do for d in $DIRS; do
    set -- ${R[dpdk.$ring.$d.$s]} ${R[memnic.$ring.$d.$s]}
    printf '%-6s %-3s %5s | %5.2f %5.2f %5.2f n=%-2s | %5.2f %5.2f %5.2f n=%-2s | %s %s %s\n' \
        "$ring" "$d" "$s" "$1" "$2" "$3" "$4" "$5" "$6" "$7" "$8" \
        "$(ratio "$5" "$1")" "$(ratio "$6" "$2")" "$(ratio "$7" "$3")"
done; done; done
