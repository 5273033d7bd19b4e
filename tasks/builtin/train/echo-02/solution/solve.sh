#!/bin/bash
echo delta > answer.txt
