#!/bin/bash
echo quartz > answer.txt
