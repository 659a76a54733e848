# The task shim: a tiny supervisor between the worker and one task's process (POSIX sh, so it
# starts in about a millisecond; a Python shim cost 60 ms of CPU per task).
#
#     sh shim.sh EXIT_FILE MARK [--synapse-stdin PYTHON LAUNCH DIR FIFO] CMD [ARGS...]
#
# The worker starts the shim in a new session, so the task has its own process group and
# outlives a crash or restart of the worker. First the shim makes an empty file MARK.PID.TICKS (its
# pid and start time in its name, so the file appears whole: nothing to rename, which would take a
# process, mv), so a worker that crashed between forking it and recording it still finds it. Then it
# runs the command in the same process group, waits, and writes the exit status to EXIT_FILE
# (128+N when the task was killed by signal N, as shells report it). A restarted
# worker therefore re-adopts a task, or learns how it ended.
#
# A stop is SIGTERM to the whole group, after a checkpoint notice (another signal to the group) when
# the job asks for one: the trap below keeps the shim alive through each of them (a handler, not an
# ignore, so the task itself still gets the default action, or its own handler) until the task has
# gone and its status is written. It names every signal a notice may be (NOTICE_SIGNALS in
# synapse/core/jobs/jobspec.py). SIGKILL to the group kills the shim too: the worker then reports the
# task as killed (no exit file).
#
# With SYNAPSE_SHIM_CGROUPS set (cgroup.procs files, ':'-separated), the shim first moves itself
# into those cgroups, so the task and everything it forks are confined from their first
# instruction. If it cannot, it runs nothing: it writes why to EXIT_FILE.err, and 125 as the
# status (a task never runs unconfined without anyone knowing).
#
# With --synapse-stdin (rank 0 of a job `synctl run` attaches), the command's stdin is a pipe from
# the stdin host (stdio_host.py, run as PYTHON -I -S -c LAUNCH DIR FIFO pipe), which feeds it what the
# worker writes into FIFO; the two run as a pipeline, so the command starts without waiting for the
# host's interpreter (nor ends waiting for it), and the status is the command's.
#
# The shim's own files are private (the worker's umask, 077); the task runs with the umask the
# worker was started with (SYNAPSE_TASK_UMASK): its files are its owner's business.
exit_file=$1
mark=$2
shift 2
feed=
if [ "${1:-}" = "--synapse-stdin" ]; then
    feed_python=$2 feed_launch=$3 feed_dir=$4 feed_fifo=$5
    shift 5
    feed=1
fi
task_umask=${SYNAPSE_TASK_UMASK:-}
unset SYNAPSE_TASK_UMASK
read -r _pid _comm _state _ppid _pgrp _sess _tty _tpgid _flags _minflt _cminflt _majflt _cmajflt \
    _utime _stime _cutime _cstime _prio _nice _threads _itreal start_ticks _rest < /proc/$$/stat
: > "$mark.$$.$start_ticks"
if [ -n "${SYNAPSE_SHIM_CGROUPS:-}" ]; then
    cgroups=$SYNAPSE_SHIM_CGROUPS
    unset SYNAPSE_SHIM_CGROUPS
    saved_ifs=$IFS
    IFS=:
    for procs in $cgroups; do
        if ! { printf '%s\n' "$$" > "$procs"; } 2>/dev/null; then
            printf 'cannot join cgroup %s, so the task was not started\n' "${procs%/cgroup.procs}" \
                > "$exit_file.err"
            cat "$exit_file.err" >&2
            printf '125\n' > "$exit_file.tmp" && mv -f "$exit_file.tmp" "$exit_file"
            exit 125
        fi
    done
    IFS=$saved_ifs
fi
trap 'true' TERM INT HUP QUIT USR1 USR2 ALRM URG WINCH XCPU XFSZ VTALRM PROF
[ -z "$task_umask" ] || umask "$task_umask"
if [ -n "$feed" ]; then
    # The host ignores the task's signals from its first instruction (a stop or Ctrl-C while its
    # interpreter starts would end it). It runs in the background of the pipeline's first half, so
    # the task's end waits for neither its start nor its end: it ends by itself once the command's
    # stdin has no reader left (or with the task's cgroup, or the group's SIGKILL).
    { trap '' TERM INT HUP QUIT USR1 USR2 ALRM URG WINCH XCPU XFSZ VTALRM PROF
      "$feed_python" -I -S -c "$feed_launch" "$feed_dir" "$feed_fifo" pipe & } | "$@"
else
    "$@"
fi
code=$?
umask 077
# Written in place, in one write of a few bytes, not renamed from a temporary file: mv is a program
# to start (1-2 ms on the task's end, which a waiting gang waits for). Read only once this shim has
# gone (runtime.exit_code), the file is whole then; a shim killed before its write leaves it empty
# or absent, which both read as "no status", as before.
printf '%s\n' "$code" > "$exit_file"
exit "$code"
