#!/bin/bash
echo heron > answer.txt
