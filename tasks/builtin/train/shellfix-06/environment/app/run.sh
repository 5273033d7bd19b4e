#!/bin/bash
if true; then
  echo "zephyr"
