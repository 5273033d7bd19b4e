#!/bin/bash
for w in "harbor"; do
  echo "$w"
