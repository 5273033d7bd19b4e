#!/bin/bash
if true
  echo "maple"
fi
