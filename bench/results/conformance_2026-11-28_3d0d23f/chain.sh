#!/bin/bash
# The f7bde2b run's runs, one after the other, each at nice 19 (run.sh): the operator suite for
# xnnpack+openvino, then the model tests for the four stacks.
set -u
OUT=$(cd "$(dirname "$0")" && pwd); SNAP=$1
$OUT/run.sh ops_xnnpack+openvino $SNAP xnnpack+openvino operators
$OUT/run.sh models $SNAP xnnpack,openvino,openvino+xnnpack,xnnpack+openvino models
