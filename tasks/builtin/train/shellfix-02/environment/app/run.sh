#!/bin/bash
echo "apple"
exit 1
