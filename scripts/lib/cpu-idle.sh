# shellcheck shell=bash
# Sourced by the benchmarks. cpu_idle: the CPU idle driver and, for
# haltpoll, its guest_halt_poll_ns. On a VM whose idle vCPUs halt at once
# (haltpoll with guest_halt_poll_ns=0), every FUSE round trip that wakes an
# idle CPU goes through the hypervisor, which dominates metadata ratios.
cpu_idle() {
  local idle poll=/sys/module/haltpoll/parameters/guest_halt_poll_ns
  idle=$(cat /sys/devices/system/cpu/cpuidle/current_driver 2>/dev/null || echo unknown)
  [[ -r $poll ]] && idle+=" (guest_halt_poll_ns=$(cat "$poll"))"
  echo "$idle"
}
