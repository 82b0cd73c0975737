#!/usr/bin/env bash
# (`memnic bench` runs this comparison too, with a table, --json and --svg; see the README.)
# txonly -> rxonly over one MEMNIC region, two `memnic testpmd` processes, one CPU each:
# Mpps per frame size, the median of the receiver's 1-s Rx-pps samples (first two and last one
# dropped as warm-up and shut-down), with min-max. Both directions: host->guest, guest->host.
#
#   benches/testpmd-pair.sh [--seconds N] [--sizes "64 128 ..."] [--json]
set -euo pipefail
T=8
SIZES="64 128 256 512 1024 1280 1518"
JSON=0
while [ $# -gt 0 ]; do
    case "$1" in
        --seconds) T=$2; shift 2 ;;
        --sizes) SIZES=$2; shift 2 ;;
        --json) JSON=1; shift ;;
        *) echo "testpmd-pair.sh: unknown option '$1' (use --seconds N, --sizes \"64 128\", --json)" >&2; exit 2 ;;
    esac
done
cd "$(dirname "$0")/.."
cargo build --release -q
BIN=target/release/memnic
DIR=$(mktemp -d)
trap 'pkill -P $$ 2>/dev/null || true; rm -rf "$DIR"; rm -f /dev/shm/memnic-pair-$$' EXIT
SHM=memnic-pair-$$

# run SENDER_ROLE SIZE -> prints "median min max samples" of the receiver's Rx-pps in Mpps
run() {
    local sender=$1 size=$2 host_mode guest_mode rx_log
    if [ "$sender" = host ]; then host_mode=txonly; guest_mode=rxonly; rx_log=$DIR/guest.log
    else host_mode=rxonly; guest_mode=txonly; rx_log=$DIR/host.log; fi
    rm -f /dev/shm/$SHM
    timeout 60 $BIN testpmd -l 0 --vdev memnic0,path=$SHM,role=host --forward-mode=$host_mode \
        --txpkts="$size" --stats-period 1 --duration $((T + 3)) >"$DIR/host.log" 2>&1 &
    local hp=$!
    sleep 1
    timeout 60 $BIN testpmd -l 1 --vdev memnic0,path=$SHM,role=guest --forward-mode=$guest_mode \
        --txpkts="$size" --stats-period 1 --duration "$T" >"$DIR/guest.log" 2>&1
    wait $hp
    grep -a 'Rx-pps:' "$rx_log" | awk '$2>0{print $2}' | head -n -1 | tail -n +3 | sort -n |
        awk '{a[NR]=$1} END{ if (NR==0) {print "0 0 0 0"; exit}
             m = (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2;
             printf "%.3f %.3f %.3f %d\n", m/1e6, a[1]/1e6, a[NR]/1e6, NR }'
}

rows=()
for s in $SIZES; do
    read -r hm hmin hmax hn < <(run host "$s")
    read -r gm gmin gmax gn < <(run guest "$s")
    rows+=("$s $hm $hmin $hmax $hn $gm $gmin $gmax $gn")
done

if [ $JSON = 1 ]; then
    printf '['
    sep=
    for r in "${rows[@]}"; do
        set -- $r
        printf '%s{"size":%s,"host_to_guest_mpps":%s,"host_to_guest_min":%s,"host_to_guest_max":%s,"host_to_guest_samples":%s,"guest_to_host_mpps":%s,"guest_to_host_min":%s,"guest_to_host_max":%s,"guest_to_host_samples":%s}' \
            "$sep" "$@"
        sep=,
    done
    printf ']\n'
else
    echo "memnic testpmd txonly -> rxonly over MEMNIC, two processes on CPUs 0 and 1, ${T} s per run"
    printf '%6s | %-26s | %-26s\n' size "host->guest Mpps (min-max)" "guest->host Mpps (min-max)"
    printf -- '-------+----------------------------+---------------------------\n'
    for r in "${rows[@]}"; do
        set -- $r
        printf '%6s | %6.2f (%5.2f-%5.2f) n=%-3s | %6.2f (%5.2f-%5.2f) n=%-3s\n' "$1" "$2" "$3" "$4" "$5" "$6" "$7" "$8" "$9"
    done
fi
