# Shared by the benchmark scripts (sourced after tests/emulator.sh, with WORK set): timing
# helpers and the shaped link in front of the emulator.

now() { date +%s.%N; }
# MB/s for $1 bytes between times $2 and $3.
mbps() { awk -v b="$1" -v s="$2" -v e="$3" 'BEGIN { printf "%.1f", b / 1e6 / (e - s) }'; }
# The median of the numbers on standard input.
median() { sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }

# Starts link-proxy (tests/proxy) in front of the emulator at EMU_URL, with the given shaping
# options (--rate, --up-rate, --latency, ...); sets PROXY_PID and PROXY (its host:port).
start_proxy() {
  target/release/link-proxy --upstream "${EMU_URL#http://}" "$@" > "$WORK/proxy.out" &
  PROXY_PID=$!
  for _ in $(seq 50); do [ -s "$WORK/proxy.out" ] && break; sleep 0.1; done
  PROXY=$(awk '{print $2}' "$WORK/proxy.out")
}
