#!/bin/sh
# Registers, then ignores stop requests and SIGTERM: only SIGKILL ends it. Arguments are
# ignored (tests pass a marker to find the process in the process table).
trap '' TERM
printf '%s\n' '{"jsonrpc":"2.0","id":1,"method":"map/connect","params":{"participantType":"agent"}}'
printf '%s\n' '{"jsonrpc":"2.0","id":2,"method":"map/agents/register","params":{}}'
while :; do sleep 1; done
