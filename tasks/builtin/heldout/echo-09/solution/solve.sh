#!/bin/bash
echo harbor > answer.txt
