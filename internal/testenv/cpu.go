package testenv

import (
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// CPU accounting of the machine's processes from /proc, for benchmarks that say where a
// run's CPU went: this process, the servers and the `locks` processes they start.

// procStat is what /proc/<pid>/stat says of one process.
type procStat struct {
	pid, ppid   int
	comm        string
	cpu         float64 // utime + stime, seconds
	childrenCPU float64 // cutime + cstime: children that exited and were waited for
}

// clockTick is USER_HZ, 100 on every Linux this runs on (getconf CLK_TCK).
const clockTick = 100

func readStat(pid int) (procStat, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, false
	}
	s := string(b)
	i, j := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if i < 0 || j < i {
		return procStat{}, false
	}
	f := strings.Fields(s[j+1:])
	if len(f) < 15 {
		return procStat{}, false
	}
	num := func(k int) float64 { v, _ := strconv.ParseFloat(f[k], 64); return v }
	ppid, _ := strconv.Atoi(f[1])
	return procStat{pid: pid, ppid: ppid, comm: s[i+1 : j], cpu: (num(11) + num(12)) / clockTick,
		childrenCPU: (num(13) + num(14)) / clockTick}, true
}

// cpuOf is the CPU seconds used so far by every process whose command name is one of comms:
// their own, plus what their exited children used (counted by the parent outside the group),
// so that short-lived processes (Postgres backends) are not lost between two readings.
func cpuOf(comms ...string) float64 {
	entries, _ := os.ReadDir("/proc")
	in := map[int]procStat{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, ok := readStat(pid); ok {
			for _, c := range comms {
				if st.comm == c {
					in[pid] = st
				}
			}
		}
	}
	var sum float64
	for _, st := range in {
		sum += st.cpu
		if _, parentIn := in[st.ppid]; !parentIn {
			sum += st.childrenCPU
		}
	}
	return sum
}

// Component is one line of a CPU table: how to read its CPU seconds so far.
type Component struct {
	Name string
	CPU  func() float64
}

// ProcCPU is the CPU seconds (user and system) process pid has used so far; false when
// /proc cannot tell (the process is gone, or not on this machine).
func ProcCPU(pid int) (float64, bool) {
	st, ok := readStat(pid)
	return st.cpu, ok
}

// PidCPU reads the CPU seconds of one process (and of its waited-for children).
func PidCPU(pid int) func() float64 {
	return func() float64 {
		st, _ := readStat(pid)
		return st.cpu + st.childrenCPU
	}
}

// MachineCPU is the CPU seconds the machine's cores have been busy so far, all of them and
// every process (anyone's, not only the run's), from /proc/stat: over a span, divided by its
// wall time, how many cores were busy (0 when /proc cannot tell).
func MachineCPU() float64 {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0
	}
	var busy float64
	for _, k := range []int{1, 2, 3, 6, 7, 8} { // user nice system irq softirq steal (not idle, iowait)
		v, _ := strconv.ParseFloat(f[k], 64)
		busy += v
	}
	return busy / clockTick
}

// Servers are the local servers the tests run against (NATS is embedded or a process of the
// test's own), and this process: the load generator, its receiver and the samplers.
func Servers() []Component {
	return []Component{
		{"rabbitmq", func() float64 { return cpuOf("beam.smp", "erl_child_setup", "epmd", "inet_gethost") }},
		{"postgres", func() float64 { return cpuOf("postgres") }},
		{"clickhouse", func() float64 { return cpuOf("clickhouse-serv", "clickhouse-server") }},
		{"loadgen", PidCPU(os.Getpid())},
	}
}

// CPUMeter takes CPU seconds of every component at start and at stop.
type CPUMeter struct {
	cs     []Component
	before []float64
	Start  time.Time
}

// StartCPU reads every component's CPU seconds now.
func StartCPU(cs []Component) *CPUMeter {
	m := &CPUMeter{cs: cs, Start: time.Now()}
	for _, c := range cs {
		m.before = append(m.before, c.CPU())
	}
	return m
}

// CPUUse is one component's CPU over the measured span.
type CPUUse struct {
	Name    string
	Seconds float64
	Percent float64 // of one core
}

// Stop reads every component again: what each used since StartCPU.
func (m *CPUMeter) Stop() []CPUUse {
	wall := time.Since(m.Start).Seconds()
	var out []CPUUse
	for i, c := range m.cs {
		s := c.CPU() - m.before[i]
		out = append(out, CPUUse{c.Name, s, 100 * s / wall})
	}
	return out
}

// ReportCPU reports each component's share of one core (unit <name>-cpu%) and the total.
func ReportCPU(b *testing.B, use []CPUUse) {
	var total float64
	for _, u := range use {
		b.ReportMetric(u.Percent, u.Name+"-cpu%")
		total += u.Percent
		b.Logf("CPU %-24s %8.1f s %6.1f%% of one core", u.Name, u.Seconds, u.Percent)
	}
	b.ReportMetric(total, "total-cpu%")
}

// ReportCPUPer reports each component's CPU µs per unit of work (unit <name>-cpu-µs/<unit>)
// and the total: what one more reading costs the whole machine, beside its throughput.
func ReportCPUPer(b *testing.B, use []CPUUse, n float64, unit string) {
	var total float64
	for _, u := range use {
		per := u.Seconds / n * 1e6
		b.ReportMetric(per, u.Name+"-cpu-µs/"+unit)
		total += per
		b.Logf("CPU %-24s %8.1f s %6.1f%% of one core, %6.1f µs per %s", u.Name, u.Seconds, u.Percent, per, unit)
	}
	b.ReportMetric(total, "machine-cpu-µs/"+unit)
}

// SelfCPU is the user and system CPU time this process (a benchmark running its part in
// process) has used so far.
func SelfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
