#!/bin/sh
# Registers, complains on stderr, and crashes with exit code 3 shortly after.
printf '%s\n' '{"jsonrpc":"2.0","id":1,"method":"map/connect","params":{"participantType":"agent"}}'
printf '%s\n' '{"jsonrpc":"2.0","id":2,"method":"map/agents/register","params":{}}'
sleep 0.3
echo "fatal: something broke" >&2
exit 3
