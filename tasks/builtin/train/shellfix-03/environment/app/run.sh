#!/bin/bash
N=3
if [ "$N" -eq 3]; then echo "heron"; fi
