#!/bin/bash
echo maple > answer.txt
