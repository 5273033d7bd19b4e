#!/bin/bash
if true; then
  echo "orbit"
