#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Guest side of e2e-lifecycle.sh: say so, then idle (ignores ACPI power button).
echo "IDLE-READY"
sleep 600
